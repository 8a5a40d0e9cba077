"""Conversations and chat templates shared by the chat tests of both tiers, and a tokenizer trained here to carry
a template of its own (special tokens included)."""

from __future__ import annotations

from toolkit.data.tokenizers import HFTokenizer

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
