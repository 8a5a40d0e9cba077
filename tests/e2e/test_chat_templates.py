"""A tokenizer's own chat template, which came with a folder from elsewhere, renders in a process of its own: the
same text as transformers' apply_chat_template, the loss mask following its tokens, its refusals named with the
line; and a budget it cannot escape. A template that loops for hours or allocates gigabytes is stopped at the budget
with one line naming its folder, in `trainbook train` (where Ctrl-C and SIGTERM work throughout) as in a process
that renders many conversations, which goes on with a fresh renderer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from toolkit.data import template_process
from toolkit.data.chat import ChatTemplate
from toolkit.data.documents import DataFormatError
from toolkit.data.template_process import TemplateBudgetError

from chat_samples import ALTERNATING, LAST_TURN_SPECIAL, TALK, ZEPHYR, counted_text, trained_tokenizer
from conftest import PROJECT, cli

# Each loops or allocates once a message says "spin": conversations without it render as ZEPHYR does
SPINS = "{% if 'spin' in messages[-1]['content'] %}"
LOOPS = SPINS + "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}" + ZEPHYR
ALLOCATES = SPINS + "{{ messages[-1]['content'] * 1000000000 }}{% endif %}" + ZEPHYR  # 4 GB
SPIN = [{"role": "user", "content": "spin"}, {"role": "assistant", "content": "ok"}]


def test_a_tokenizers_own_template_is_used_and_the_mask_follows_its_tokens():
    tokenizer = trained_tokenizer(ZEPHYR)
    template = ChatTemplate(tokenizer)
    assert template.source == "the tokenizer's chat_template"
    ids, counted = template.tokens(TALK, last_only=False, place="line 1")
    assert ids == tokenizer.encode(tokenizer.hf.apply_chat_template(TALK, tokenize=False))  # one tokenization
    end = tokenizer.hf.convert_tokens_to_ids("<|end|>")
    assert end in ids and counted[ids.index(end)] == 0  # the system turn's end marker is not the assistant's
    assert counted_text(tokenizer, ids, counted) == "4.<|end|>\n6, as before.<|end|>\n"
    assert counted.dtype == np.uint8 and len(counted) == len(ids)


def test_a_template_that_refuses_a_conversation_is_named_with_the_line():
    template = ChatTemplate(trained_tokenizer(ALTERNATING))
    with pytest.raises(DataFormatError) as refused:
        template.tokens(TALK, last_only=False, place="line 7 of 'chats.jsonl'")
    message = str(refused.value)
    assert "line 7 of 'chats.jsonl' does not render with the tokenizer's chat_template" in message
    assert "Conversation roles must alternate" in message


def test_a_template_whose_first_turns_do_not_start_the_whole_is_refused():
    with pytest.raises(DataFormatError, match="renders the first turns differently from the whole conversation"):
        ChatTemplate(trained_tokenizer(LAST_TURN_SPECIAL)).tokens(TALK, last_only=False, place="line 1")


@pytest.mark.parametrize("template, problem", [(LOOPS, "took longer than 1 s"),
                                               (ALLOCATES, "needed more than 1,024 MiB")], ids=["loops", "allocates"])
def test_a_template_out_of_its_budget_is_stopped_naming_its_folder_and_the_next_conversation_renders(
        template, problem):
    chat = ChatTemplate(trained_tokenizer(template))
    chat.renderer.time_s = 1.0  # the product's 5 s, shortened here (the CLI test below waits the whole budget)
    started = time.monotonic()
    with pytest.raises(TemplateBudgetError) as refused:
        chat.tokens(SPIN, last_only=False, place="line 3")
    assert time.monotonic() - started < chat.renderer.time_s + 3
    assert str(refused.value).startswith("chat template: the chat template of 'trained here' " + problem)
    assert counted_text(chat.tokenizer, *chat.tokens(TALK, last_only=False, place="line 4")).endswith("<|end|>\n")
    renderer = chat.renderer.process
    chat.close()
    assert renderer.poll() is not None


def test_the_renderer_ends_with_the_process_that_started_it_even_while_a_template_spins(tmp_path):
    code = ("import sys; sys.path[:0] = [%r, %r]; from chat_samples import *; from toolkit.data.chat import ChatTemplate; "
            "c = ChatTemplate(trained_tokenizer(%r)); c.render(TALK, 'x'); print(c.renderer.process.pid, flush=True); "
            "c.render([{'role': 'user', 'content': 'spin'}], 'x')") % (str(PROJECT / "tests"), str(PROJECT), LOOPS)
    starter = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=PROJECT)
    try:
        renderer = psutil.Process(int(starter.stdout.readline()))
        starter.kill()
        starter.wait()
        renderer.wait(timeout=10)  # an event: psutil waits on the process itself
    finally:
        starter.kill()


@pytest.fixture
def spinning_tokenizer(tmp_path):
    """A tokenizer folder whose template loops on a conversation that says "spin" (the fourth line below)."""
    folder = tmp_path / "spinning-tokenizer"
    trained_tokenizer(LOOPS).hf.save_pretrained(str(folder))
    rows = [{"messages": TALK}] * 3 + [{"messages": SPIN}] + [{"messages": TALK}] * 20
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def train_on(tmp_path, tokenizer) -> list[str]:
    return ["train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", "model.name=hf",
            "--set", "model.hf.architecture=llama", "--set", 'model.hf.config={"hidden_size": 32, '
            '"intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 320}',
            "--set", f"data.path={tmp_path / 'chats.jsonl'}", "--set", f"data.tokenizer={tokenizer}",
            "--set", "data.chat=messages", "--set", "train.max_steps=2"]


def test_train_refuses_a_template_that_loops_in_one_line_naming_its_folder(tmp_path, spinning_tokenizer):
    proc = cli(*train_on(tmp_path, spinning_tokenizer), timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"the chat template of {str(spinning_tokenizer)!r} took longer than 5 s" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists(), proc.stderr[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_and_sigterm_stop_train_while_a_template_renders(tmp_path, spinning_tokenizer, signum):
    train = subprocess.Popen([sys.executable, "-m", "toolkit", *train_on(tmp_path, spinning_tokenizer)], cwd=PROJECT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        command = psutil.Process(train.pid)
        deadline = time.monotonic() + 60
        while not [c for c in command.children() if "toolkit.data.template_process" in c.cmdline()]:
            assert time.monotonic() < deadline and train.poll() is None, train.communicate()
            time.sleep(0.05)
        (renderer,) = [c for c in command.children() if "toolkit.data.template_process" in c.cmdline()]
        train.send_signal(signum)
        _, err = train.communicate(timeout=template_process.TIME_S - 1)  # before the budget would have ended it
        assert train.returncode == 128 + signum, err[-3000:]
        assert "before the run started: nothing was started" in err and "Traceback" not in err, err[-3000:]
        renderer.wait(timeout=10)
        assert not (tmp_path / "r").exists()
    finally:
        train.kill()
