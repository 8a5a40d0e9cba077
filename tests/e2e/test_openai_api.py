"""The endpoint's OpenAI-compatible API, through the official `openai` client: a GPT fine-tuned here on chats (bytes,
ChatML) answers its chat as it learned it, streaming included, stops at its end-of-turn marker, and refuses a wrong
key and bad fields as OpenAI's API would; a client that leaves mid-stream leaves the server well."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")  # the test extra installs it

from toolkit.data import template_process  # noqa: E402
from toolkit.deploy.export import export_run  # noqa: E402
from toolkit.deploy.serving.endpoint import serve  # noqa: E402

from conftest import cli  # noqa: E402
from test_chat import TEMPLATE, chat_tokenizer  # noqa: E402, F401 (a fixture: a tokenizer trained here, its own template)
from test_your_data import llama  # noqa: E402

ANSWERS = {"Say hi": "Hi there!", "Say bye": "Bye now."}
LOOPS_ON_SPIN = ("{% if messages[-1]['content'] == 'spin' %}{% for i in range(100000) %}{% for j in range(100000) %}"
                 "{% endfor %}{% endfor %}{% endif %}")


def learned_by_heart(root, *flags: str):
    """A model fine-tuned on two short chats until it answers them by heart, exported."""
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in ANSWERS.items()] * 40
    (root / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = cli("train", "tiny", "--run-dir", str(root / "run"), "--set", f"data.path={root / 'chats.jsonl'}",
               "--set", "data.chat=messages", "--set", "model.block_size=96", "--set", "train.max_steps=150",
               "--set", "optim.lr=3e-3", "--set", "train.eval_every=150", *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return export_run(root / "run").path


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The tiny GPT on bytes, so ChatML."""
    return learned_by_heart(tmp_path_factory.mktemp("chat-model"))


@pytest.fixture(scope="module")
def endpoint(chat_model, tmp_path_factory):
    with serve(chat_model, workspace=tmp_path_factory.mktemp("ws"), max_batch=8, max_wait_ms=5) as ep:
        yield ep


@pytest.fixture
def client(endpoint):
    return openai.OpenAI(base_url=endpoint.openai_url, api_key=endpoint.key, max_retries=0, timeout=60)


def ask(client, question: str, **options):
    """One question, greedy unless ``options`` say otherwise."""
    return client.chat.completions.create(model="any", messages=[{"role": "user", "content": question}],
                                          **{"temperature": 0, **options})


def test_the_model_is_listed_and_answers_its_chats_ending_at_its_turn_marker(client):
    (model,) = client.models.list().data
    for question, answer in ANSWERS.items():
        reply = ask(client, question, max_tokens=40)
        assert reply.choices[0].message.content == answer and reply.choices[0].finish_reason == "stop"
        assert reply.model == model.id and reply.object == "chat.completion"
        prompt = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"  # ChatML, in bytes
        assert reply.usage.prompt_tokens == len(prompt.encode())
        assert reply.usage.completion_tokens >= len(answer) + len("<|im_end|>")  # the marker is generated, not shown
    cut = ask(client, "Say hi", max_tokens=3)
    assert cut.choices[0].message.content == "Hi " and cut.choices[0].finish_reason == "length"


def test_streaming_gives_the_same_answer_in_pieces_and_the_usage_last(client):
    chunks = list(ask(client, "Say bye", max_tokens=40, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWERS["Say bye"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # pieces, not one block
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > len(ANSWERS["Say bye"])


def test_completions_n_seed_and_stop(client):
    prompt = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"
    done = client.completions.create(model="any", prompt=prompt, max_tokens=40, temperature=0, stop=["<|im_end|>"])
    assert done.choices[0].text == "Hi there!" and done.choices[0].finish_reason == "stop"
    assert client.completions.create(model="any", prompt=prompt, max_tokens=40, temperature=0,
                                     stop=[" there"]).choices[0].text == "Hi"
    several = ask(client, "Say hi", max_tokens=12, temperature=1.5, seed=7, n=3)
    again = ask(client, "Say hi", max_tokens=12, temperature=1.5, seed=7, n=3)
    assert len(several.choices) == 3 and [c.index for c in several.choices] == [0, 1, 2]
    assert [c.message.content for c in several.choices] == [c.message.content for c in again.choices]


def test_a_wrong_key_and_bad_fields_are_refused_as_openai_refuses_them(endpoint, client):
    wrong = openai.OpenAI(base_url=endpoint.openai_url, api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="Authorization: key not valid"):
        wrong.chat.completions.create(model="any", messages=[{"role": "user", "content": "Say hi"}])
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    with pytest.raises(openai.BadRequestError, match=r"temperature: 3 is not allowed; allowed: a number from 0 to 2"):
        ask(client, "Say hi", temperature=3)
    with pytest.raises(openai.BadRequestError, match=r"tools: not supported by this endpoint; allowed: max_completion_tokens, max_tokens, messages"):
        ask(client, "Say hi", tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\].role: 'robot' is not allowed"):
        client.chat.completions.create(model="any", messages=[{"role": "robot", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match=r"max_tokens: 513 is not allowed; allowed: an integer from 1 to 512"):
        ask(client, "Say hi", max_tokens=513)
    with pytest.raises(openai.BadRequestError, match=r"n: 2 is not allowed; allowed: an integer from 1 to 1"):
        ask(client, "Say hi", n=2, stream=True)


def test_a_client_that_leaves_mid_stream_has_its_generation_dropped(endpoint, client):
    def settled() -> tuple[int, int]:
        """The server's counts of requests answered and dropped (readiness, with the key)."""
        with urllib.request.urlopen(urllib.request.Request(endpoint.scoring_url, headers=endpoint.headers()),
                                    timeout=30) as response:
            stats = json.loads(response.read())
        return stats["answered"], stats["dropped"]

    # A completion with no stop string generates all 512 tokens, far longer than the hang-up takes to notice, unless
    # a loaded machine stalls this client between its first chunk and its hang-up. So each try waits for the request
    # to leave the server (answered or dropped) and the test asks for one drop in five tries: a server that never
    # drops a generation fails every one.
    for _ in range(5):
        answered, dropped = settled()
        stream = client.completions.create(model="any", prompt="Say", temperature=1.0, max_tokens=512, stream=True)
        next(iter(stream))
        stream.close()  # the client hangs up after the first chunk
        deadline = time.monotonic() + 60
        while sum(settled()) == answered + dropped and time.monotonic() < deadline:
            time.sleep(0.05)  # polls the server's own counts; the drop happens in its thread, not ours
        now = settled()
        assert sum(now) == answered + dropped + 1, f"the request has not left the server in 60 s: {now}"
        if now[1] == dropped + 1:
            break
    else:
        pytest.fail("five clients hung up mid-stream and the server finished every generation")
    assert ask(client, "Say bye", max_tokens=40).choices[0].message.content == ANSWERS["Say bye"]


def test_a_transformers_model_answers_with_its_own_template_and_kv_cache(tmp_path, chat_tokenizer):  # noqa: F811
    """A Llama with the tokenizer trained here and its Zephyr-style template, whose turn ends at the special token
    <|end|> (a decoder skipping special tokens never shows it: the id itself ends the answer). The template also
    loops for ever on a message that says "spin" (a template from elsewhere): such a request is answered 500 within
    the template's budget, and the endpoint goes on answering the others."""
    tokenizer = tmp_path / "tokenizer"
    shutil.copytree(chat_tokenizer, tokenizer)
    config = json.loads((tokenizer / "tokenizer_config.json").read_text())
    (tokenizer / "chat_template.jinja").unlink(missing_ok=True)
    config["chat_template"] = LOOPS_ON_SPIN + TEMPLATE
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    model = learned_by_heart(tmp_path, *llama(320), "--set", f"data.tokenizer={tokenizer}")
    with serve(model, workspace=tmp_path / "ws", max_batch=4, max_wait_ms=5) as ep:
        assert ep.runtime == "torch"
        client = openai.OpenAI(base_url=ep.openai_url, api_key=ep.key, max_retries=0, timeout=60)
        for question, answer in ANSWERS.items():
            reply = ask(client, question, max_tokens=40)
            assert reply.choices[0].message.content == answer, reply
            assert reply.choices[0].finish_reason == "stop"
        streamed = "".join(c.choices[0].delta.content or "" for c in ask(client, "Say hi", max_tokens=40,
                                                                          stream=True))
        assert streamed == ANSWERS["Say hi"]
        started = time.monotonic()
        with pytest.raises(openai.InternalServerError, match="took longer than 5 s"):
            ask(client, "spin", max_tokens=5)
        assert time.monotonic() - started < template_process.TIME_S + 5
        assert ask(client, "Say bye", max_tokens=40).choices[0].message.content == ANSWERS["Say bye"]
        log = ep.log_path.read_text()  # one line, no traceback through the endpoint's code
        assert f"the chat template of {str(model)!r} took longer than 5 s" in log and "openai_api.py" not in log


def tool_call(**function) -> dict:
    return {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{}", **function}}


# Assistant turns whose tool calls OpenAI's API refuses, and how this endpoint names the field
TOOL_CALL_REFUSALS = [
    ({"role": "assistant", "tool_calls": "add(1, 2)"}, "messages[1].tool_calls: 'add(1, 2)' is not allowed"),
    ({"role": "assistant", "tool_calls": 5}, "messages[1].tool_calls: 5 is not allowed"),
    ({"role": "assistant", "tool_calls": [{"function": 5}]}, "messages[1].tool_calls[0].id: None is not allowed"),
    ({"role": "assistant", "tool_calls": [{**tool_call(), "function": 5}]},
     "messages[1].tool_calls[0].function: 5 is not allowed"),
    ({"role": "assistant", "tool_calls": ["add"]}, "messages[1].tool_calls[0]: 'add' is not allowed"),
    ({"role": "assistant", "tool_calls": [tool_call(name=7)]}, "messages[1].tool_calls[0].function.name: 7 is not"),
    ({"role": "assistant", "tool_calls": [tool_call(arguments={"a": 1})]},
     "messages[1].tool_calls[0].function.arguments: a JSON object of 1 item is not allowed; allowed: a string"),
    ({"role": "assistant", "tool_calls": [tool_call(arguments="[" * 5000 + "]" * 5000)]},
     "messages[1].tool_calls[0].function.arguments: arguments: nested deeper than 32 levels"),
    ({"role": "user", "content": "x", "tool_calls": [tool_call()]},
     "messages[1].tool_calls: is not allowed in a user message"),
    ({"role": "tool", "content": "3", "tool_call_id": 1}, "messages[1].tool_call_id: 1 is not allowed"),
]


def test_a_conversation_with_tool_calls_is_answered(client):
    reply = client.chat.completions.create(model="any", temperature=0, max_tokens=5, messages=[
        {"role": "user", "content": "Add 1 and 2"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call(arguments='{"a": 1, "b": 2}')]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}, {"role": "user", "content": "Say hi"}])
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > len('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}')


@pytest.mark.parametrize("path, body, status, message", [
    ("chat/completions", b"[1, 2]", 400, "body: not a JSON object"),
    ("chat/completions", b'{"model": "m", "messages": [', 400, "body: not valid JSON"),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 400, "model: None is not allowed"),
    ("chat/completions", {"model": "m", "messages": []}, 400, "messages: a JSON array of 0 items is not allowed"),
    ("chat/completions", {"model": "m", "messages": ["hi"]}, 400, "messages[0].role: None is not allowed"),
    ("chat/completions", {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content: a JSON array of 1 item is not allowed; allowed: text, or a list of text parts"),
    ("chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["a"] * 5}, 400,
     "stop: a JSON array of 5 items is not allowed"),
    ("chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                          "stop": ["a", "b" * 257]}, 400, "allowed: a non-empty string of up to 256 characters"),
    ("chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 0}, 400,
     "n: 0 is not allowed; allowed: an integer from 1 to 4"),
    ("chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400,
     "stream: 'yes' is not allowed; allowed: true or false"),
    ("chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                          "stream_options": {"x": 1}}, 400, "stream_options: a JSON object of 1 item is not allowed"),
    *[("chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}, turn]}, 400, message)
      for turn, message in TOOL_CALL_REFUSALS],
    ("completions", {"model": "m", "prompt": ["a", "b"]}, 400, "prompt: a JSON array of 2 items is not allowed"),
    ("completions", {"model": "m", "prompt": "hi", "top_p": -1}, 400, "top_p: -1 is not allowed"),
    ("completions", {"model": "m", "prompt": "x" * 70_000}, 413, "body: 70,"),
])
def test_a_bad_request_gets_a_4xx_naming_its_field_and_the_server_stays_well(endpoint, client, path, body, status,
                                                                            message):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"{endpoint.openai_url}/{path}", data=data, headers=endpoint.headers())
    with pytest.raises(urllib.error.HTTPError) as answered:
        urllib.request.urlopen(request, timeout=30)
    assert answered.value.code == status
    problem = json.loads(answered.value.read())["error"]
    assert message in problem["message"] and problem["type"] == "invalid_request_error", problem
    assert ask(client, "Say hi", max_tokens=40).choices[0].message.content == ANSWERS["Say hi"]
