"""Conversations as data: the three shapes read into messages, bad rows refused naming file and line, and the loss
mask checked token by token for the built-in ChatML on bytes. A tokenizer's own template renders in a process of its
own (tests/e2e/test_chat_templates.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from toolkit.data.chat import CHATML, ChatTemplate
from toolkit.data.documents import DataFormat, DataFormatError, file_records
from toolkit.data.tokenizers import ByteTokenizer

from chat_samples import TALK, counted_text, trained_tokenizer

WHERE = "'chats.jsonl' of chats:1"
CHAT = DataFormat("chat", chat="messages", assistant_loss="all")
def lines(*objects) -> bytes:
    return b"\n".join(json.dumps(o).encode() for o in objects)


def test_the_three_shapes_read_into_the_same_messages():
    sharegpt = {"conversations": [{"from": "system", "value": "Answer briefly."}, {"from": "human", "value": "Hi"},
                                  {"from": "gpt", "value": "Hello."}]}
    alpaca = {"instruction": "Translate to French.", "input": "cat", "output": "chat"}
    messages = {"messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Hi"},
                             {"role": "assistant", "content": "Hello."}]}
    assert file_records("c.jsonl", lines(messages), CHAT, WHERE) == [(messages["messages"], 1)]
    got = file_records("c.jsonl", lines(sharegpt), DataFormat("chat", chat="sharegpt"), WHERE)
    assert got == [(messages["messages"], 1)]
    got = file_records("c.jsonl", b"\n" + lines(alpaca), DataFormat("chat", chat="alpaca"), WHERE)
    assert got == [([{"role": "user", "content": "Translate to French.\n\ncat"},
                     {"role": "assistant", "content": "chat"}], 2)]


@pytest.mark.parametrize(
    "row, problem",
    [
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "Hello"}]},
         "line 2 of 'chats.jsonl' of chats:1 has role 'bot' in turn 2, not one of system, user, assistant, tool"),
        ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  "}]},
         "line 2 of 'chats.jsonl' of chats:1 has an empty assistant turn (turn 2): nothing to learn from"),
        ({"messages": [{"role": "user", "content": "Hi"}]},
         "line 2 of 'chats.jsonl' of chats:1 has no assistant turn: nothing to learn from"),
        ({"messages": "Hi"}, "line 2 of 'chats.jsonl' of chats:1 has 'Hi', not a non-empty list of turns"),
        ({"text": "Hi"}, "line 2 of 'chats.jsonl' of chats:1 has no field 'messages'"),
        ({"messages": [{"role": "user", "content": ["Hi"]}, {"role": "assistant", "content": "Hello"}]},
         "line 2 of 'chats.jsonl' of chats:1 has content ['Hi'] in turn 1, not text"),
        ({"messages": [{"role": "user", "content": "Hi"},
                       {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
         "without a function name"),
    ],
)
def test_a_bad_conversation_is_refused_naming_the_file_the_line_and_the_turn(row, problem):
    good = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    with pytest.raises(DataFormatError) as refused:
        file_records("chats.jsonl", lines(good, row), CHAT, WHERE)
    assert problem in str(refused.value)
    assert '"messages": a list of {"role"' in str(refused.value)  # what is allowed


def test_a_tokenizer_without_a_template_gets_chatml():
    assert "ChatML" in ChatTemplate(trained_tokenizer(None)).source


def test_chatml_on_bytes_counts_exactly_the_assistant_turns_and_their_end_markers():
    template = ChatTemplate(ByteTokenizer())
    assert template.template == CHATML and "ChatML" in template.source
    ids, counted = template.tokens(TALK, last_only=False, place="line 1")
    text = bytes(ids).decode()
    assert text.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n")
    assert counted_text(ByteTokenizer(), ids, counted) == "4.<|im_end|>\n6, as before.<|im_end|>\n"
    ids, counted = template.tokens(TALK, last_only=True, place="line 1")
    assert counted_text(ByteTokenizer(), ids, counted) == "6, as before.<|im_end|>\n"


def test_tool_calls_and_tool_turns_render_and_the_call_is_learned():
    talk = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "a", "type": "function",
                         "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "a", "content": "rain"},
        {"role": "assistant", "content": "Rain."},
    ]
    (messages, _), = file_records("c.jsonl", lines({"messages": talk}), CHAT, WHERE)
    ids, counted = ChatTemplate(ByteTokenizer()).tokens(messages, last_only=False, place="line 1")
    assert counted_text(ByteTokenizer(), ids, counted) == (
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\nRain.<|im_end|>\n')
    assert "<|im_start|>tool\nrain<|im_end|>" in bytes(ids).decode()


def test_the_template_is_part_of_the_token_files_name():
    first = DataFormat("chat", chat="messages", assistant_loss="all", template_sha256="a" * 64)
    other = DataFormat("chat", chat="messages", assistant_loss="all", template_sha256="b" * 64)
    last = DataFormat("chat", chat="messages", assistant_loss="last", template_sha256="a" * 64)
    assert len({first.tag(True), other.tag(True), last.tag(True)}) == 3


def test_the_config_offers_exactly_the_shapes_the_reader_knows():
    from toolkit import config
    from toolkit.data.documents import CHAT_SHAPES

    assert config.CHAT_SHAPES == tuple(CHAT_SHAPES)
    with pytest.raises(config.ConfigError) as refused:
        config.load("tiny", ["data.chat=openai"])
    assert str(refused.value) == ("data.chat: 'openai' is not allowed; allowed: one of 'messages', 'sharegpt', "
                                  "'alpaca', or empty (the data is not conversations)")
    with pytest.raises(config.ConfigError, match="data.chat: 'messages' reads conversations, and data.prompt_field"):
        config.load("tiny", ["data.chat=messages", "data.prompt_field=q", "data.completion_field=a"])
