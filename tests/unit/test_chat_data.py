"""Conversations as data: the three shapes read into messages, bad rows refused naming file and line, and the loss
mask checked token by token for the built-in ChatML on bytes and for a tokenizer trained here with a chat template
of its own (special tokens included); templates that refuse a conversation or cannot be split are named."""

from __future__ import annotations

import json

import numpy as np
import pytest

from toolkit.data.chat import CHATML, ChatTemplate
from toolkit.data.documents import DataFormat, DataFormatError, file_records
from toolkit.data.tokenizers import ByteTokenizer, HFTokenizer

WHERE = "'chats.jsonl' of chats:1"
CHAT = DataFormat("chat", chat="messages", assistant_loss="all")
TALK = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "6, as before."},
]
# Zephyr's turn markers as special tokens; a template of its own, as a model folder brings it
ZEPHYR = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
ALTERNATING = (  # Llama 2's check
    "{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
)
LAST_TURN_SPECIAL = (  # renders the conversation's last turn differently: no prefix of it is a prefix of the whole
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}{% if loop.last %}{{ ' [end]' }}{% endif %}"
    "{{ '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)


def lines(*objects) -> bytes:
    return b"\n".join(json.dumps(o).encode() for o in objects)


def trained_tokenizer(template: str | None) -> HFTokenizer:
    from toolkit.data.tokenizer_training import train_bpe

    texts = [m["content"] for m in TALK] * 20 + ["the quick brown fox jumps over the lazy dog"] * 20
    hf = train_bpe(texts, vocab_size=300)
    hf.add_special_tokens({"additional_special_tokens": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]})
    if template:
        hf.chat_template = template
    return HFTokenizer(hf, "trained here")


def counted_text(tokenizer, ids, counted) -> str:
    return tokenizer.decode([i for i, c in zip(ids, counted) if c])


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


def test_a_tokenizer_without_a_template_gets_chatml():
    assert "ChatML" in ChatTemplate(trained_tokenizer(None)).source


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
