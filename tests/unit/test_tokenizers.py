"""Tokenizers without a run: the byte tokenizer as a real `tokenizers` tokenizer (ids = byte values, invalid
UTF-8 decoded as Python does), its pinned content hash, and what data.tokenizer values mean."""

from __future__ import annotations

import random

import pytest

from toolkit import config as config_mod
from toolkit.data.tokenizers import (
    BYTES_SHA256, ByteTokenizer, HFTokenizer, TokenizerError, byte_to_char, load_tokenizer, registered)


def random_text(rng: random.Random, length: int) -> str:
    """Characters from every UTF-8 length (1 to 4 bytes), whitespace and punctuation included."""
    ranges = [(0x20, 0x7F), (0x09, 0x0E), (0x80, 0x800), (0x800, 0xD800), (0xE000, 0x10000), (0x10000, 0x110000)]
    return "".join(chr(rng.randrange(*rng.choice(ranges))) for _ in range(length))


def test_the_byte_alphabet_is_the_one_tokenizers_uses():
    from tokenizers.pre_tokenizers import ByteLevel

    mapping = byte_to_char()
    assert sorted(mapping) == list(range(256)) and len(set(mapping.values())) == 256
    assert set(mapping.values()) == set(ByteLevel.alphabet())


def test_the_byte_tokenizer_as_transformers_has_the_pinned_content_hash():
    assert HFTokenizer(ByteTokenizer().hf(), "bytes").sha256 == BYTES_SHA256


def test_the_byte_tokenizer_as_transformers_encodes_and_decodes_as_ours(rng):
    ours, theirs = ByteTokenizer(), ByteTokenizer().hf()
    assert len(theirs) == 256 and theirs.eos_token_id is None
    for _ in range(200):
        text = random_text(rng, rng.randrange(0, 60))
        assert theirs.encode(text) == ours.encode(text) == list(text.encode("utf-8"))
        assert theirs.decode(ours.encode(text)) == ours.decode(ours.encode(text)) == text
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))  # mostly invalid UTF-8
        assert theirs.decode(list(raw)) == ours.decode(list(raw)) == raw.decode("utf-8", errors="replace"), raw


@pytest.mark.parametrize("value, expected", [("bytes", False), ("auto", False), ("model", False), ("./tok", False),
                                             ("tokenizers/mine", False), ("~/tok", False), ("pydoc-bpe512", True),
                                             ("pydoc-bpe512:3", True)])
def test_which_values_name_a_registered_tokenizer(value, expected):
    assert registered(value) is expected


def test_auto_is_bytes_for_a_model_without_a_tokenizer():
    assert isinstance(load_tokenizer(config_mod.load("tiny")), ByteTokenizer)


@pytest.mark.parametrize("overrides, problem", [
    (["data.tokenizer=model"], "data.tokenizer: is 'model' while model.hf.source is empty (model.name='gpt')"),
    (["data.tokenizer=/nonexistent/tok"], "data.tokenizer: '/nonexistent/tok' is not a folder holding tokenizer.json"),
    (["data.tokenizer=bad:ref:x"], "data.tokenizer: 'bad:ref:x' is not allowed"),
])
def test_a_tokenizer_that_cannot_be_found_is_refused_naming_it(overrides, problem):
    with pytest.raises(TokenizerError) as refused:
        load_tokenizer(config_mod.load("tiny", overrides))
    assert str(refused.value).startswith(problem) and "allowed: 'bytes', 'auto', 'model'" in str(refused.value)


def test_a_pinned_content_hash_must_be_a_sha256():
    with pytest.raises(config_mod.ConfigError, match="data.tokenizer_sha256: 'abc' is not allowed"):
        config_mod.load("tiny", ["data.tokenizer_sha256=abc"])


def test_a_byte_level_tokenizers_byte_lengths_count_every_byte_exactly(rng):
    from toolkit.data.tokenizer_training import train_bpe

    corpus = [random_text(rng, 200) for _ in range(50)] + ["the quick brown fox jumps " * 20]
    tokenizer = HFTokenizer(train_bpe(corpus, 400), "trained")
    lengths = tokenizer.byte_lengths()
    assert lengths[tokenizer.eos_id] == 0 and lengths.max() > 1
    for _ in range(100):
        text = random_text(rng, rng.randrange(0, 80))
        assert lengths[tokenizer.encode(text)].sum() == len(text.encode("utf-8")), text


def test_other_tokenizers_byte_lengths_read_the_tokens_text():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"▁the": 0, "▁cat": 1, "<0x0A>": 2, "s": 3, "é": 4, "</s>": 5}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="</s>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    tokenizer = HFTokenizer(PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>"), "sentencepiece-like")
    assert tokenizer.byte_lengths().tolist() == [4, 4, 1, 1, 2, 0]
