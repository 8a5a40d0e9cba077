"""Fine-tuning on conversations, for real: a transformers Llama with a tokenizer trained here that brings a chat
template of its own, trained through the CLI on a messages file, packed, killed and resumed to the same losses;
conversations too long for the context dropped and counted; bad rows refused naming file and line before anything
is written."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from toolkit.rundir import RunDir

from conftest import cli
from test_checkpoint import CKPT, EVERY, STEPS
from test_your_data import llama, token_files_in, write_jsonl

pytestmark = pytest.mark.usefixtures("private_cache")  # token files of each test's own

TEMPLATE = (  # Zephyr's markers, as special tokens of the tokenizer
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def conversations(count: int, long_every: int = 0) -> list[dict]:
    """Short arithmetic chats of one to three exchanges; every ``long_every``-th opens with a system prompt too long
    for the context, leaving no assistant token in a row."""
    rng = random.Random(3)
    rows = []
    for i in range(count):
        long = long_every and i % long_every == 0
        messages = [{"role": "system", "content": "You add." + (" Be exact! " + "#" * 400 if long else "")}]
        for _ in range(rng.randint(1, 3)):
            a, b = rng.randint(0, 30), rng.randint(0, 30)
            messages += [{"role": "user", "content": f"{a}+{b}?"}, {"role": "assistant", "content": f"{a + b}."}]
        rows.append({"messages": messages})
    return rows


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    """A folder holding a byte-level BPE tokenizer trained here on the chats, with the turn markers as special
    tokens and its own chat_template (saved as transformers saves it)."""
    from toolkit.data.tokenizer_training import train_bpe

    texts = [m["content"] for row in conversations(200) for m in row["messages"]]
    tokenizer = train_bpe(texts, 300)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>",
                                                                "<|end|>"]})
    tokenizer.chat_template = TEMPLATE
    folder = tmp_path_factory.mktemp("chat-tokenizer")
    tokenizer.save_pretrained(str(folder))
    return folder


def test_a_chat_run_packs_learns_the_assistant_turns_and_resumes_exactly_after_sigkill(tmp_path, chat_tokenizer,
                                                                                       rng):
    chats = write_jsonl(tmp_path / "chats.jsonl", conversations(300, long_every=10))
    flags = [*llama(320), "--set", f"data.path={chats}", "--set", f"data.tokenizer={chat_tokenizer}",
             "--set", "data.chat=messages", "--set", "data.pack=true", "--set", "model.block_size=96", *CKPT]
    reference = cli("train", "tiny", "--run-dir", str(tmp_path / "ref"), *flags)
    assert reference.returncode == 0, reference.stderr[-3000:]
    assert "data: 30 conversations of chats.jsonl:0 dropped: no assistant token within model.block_size=96" \
        in reference.stderr
    ref = RunDir(tmp_path / "ref")
    assert json.loads(ref.lineage_path.read_text())["data"]["dropped_examples"] == 30
    losses = {e["step"]: e["loss"] for e in ref.events("train")}
    assert np.mean([losses[s] for s in range(1, 6)]) > np.mean([losses[s] for s in range(36, 41)]) + 1.0, losses

    # trainbook evaluate: the held-out loss the run's own last evaluation measured, against its starting weights
    evaluated = cli("evaluate", str(ref.path), "--examples", "2", "--max-new-tokens", "8")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    before, after = (float(x) for x in evaluated.stdout.split("\nloss ")[1].split()[:2])
    assert after == pytest.approx(ref.events("eval")[-1]["val_loss"], rel=1e-4) and after < before - 1
    answers = [line.split(None, 1) for line in evaluated.stdout.splitlines() if line.startswith("  ")]
    assert [label for label, _ in answers] == ["prompt", "expected", "before", "after"] * 2
    assert all(text.endswith(".") and text[:-1].isdigit() for label, text in answers if label == "expected")

    kill_at = rng.randint(EVERY + 1, STEPS - 1)
    killed = cli("train", "tiny", "--run-dir", str(tmp_path / "killed"), *flags, "--set",
                 f"fault.kill_at_step={kill_at}", "--max-restarts", "1")
    assert killed.returncode == 0, f"kill at {kill_at}: {killed.stderr[-3000:]}"
    resumed = {e["step"]: e["loss"] for e in RunDir(tmp_path / "killed").events("train")}
    assert sorted(resumed) == list(range(1, STEPS + 1))
    assert [(s, resumed[s]) for s in resumed if resumed[s] != losses[s]] == [], f"kill at {kill_at}"


def test_sharegpt_chats_train_the_builtin_gpt_on_bytes_with_chatml(tmp_path):
    rows = [{"conversations": [{"from": "human" if m["role"] == "user" else "gpt", "value": m["content"]}
                               for m in row["messages"] if m["role"] != "system"]} for row in conversations(120)]
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", "model.block_size=64",
               "--set", f"data.path={write_jsonl(tmp_path / 'sharegpt.jsonl', rows)}", "--set", "data.chat=sharegpt",
               "--set", "data.assistant_loss=last", "--set", "train.max_steps=20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "completed: step 20" in proc.stderr


@pytest.mark.parametrize("row, problem", [
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "robot", "content": "Hello"}]},
     "line 3 of {path!r} has role 'robot' in turn 2, not one of system, user, assistant, tool"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]},
     "line 3 of {path!r} has an empty assistant turn (turn 2): nothing to learn from"),
    ({"messages": [{"role": "assistant", "content": "Hello"}, {"role": "assistant", "content": "Hello"}]},
     "line 3 of {path!r} does not render with the tokenizer's chat_template (TemplateError: Conversation roles "
     "must alternate"),
])
def test_a_bad_conversation_is_refused_before_a_run_directory_exists(tmp_path, chat_tokenizer, row, problem):
    (chat_tokenizer_strict := tmp_path / "strict").mkdir()
    for f in chat_tokenizer.iterdir():  # the same tokenizer, with a template that insists on alternation
        (chat_tokenizer_strict / f.name).write_bytes(f.read_bytes())
    config = json.loads((chat_tokenizer_strict / "tokenizer_config.json").read_text())
    (chat_tokenizer_strict / "chat_template.jinja").unlink(missing_ok=True)
    config["chat_template"] = (
        "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}")
    (chat_tokenizer_strict / "tokenizer_config.json").write_text(json.dumps(config))
    good = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}] * 2
    path = write_jsonl(tmp_path / "chats.jsonl", [*good, row, *good * 20])
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *llama(320), "--set", f"data.path={path}",
               "--set", f"data.tokenizer={chat_tokenizer_strict}", "--set", "data.chat=messages")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert problem.format(path=str(path)) in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists() and not token_files_in(tmp_path / "cache")
