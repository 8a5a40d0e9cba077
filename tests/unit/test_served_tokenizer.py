"""The tokenizer an endpoint reads from an export's files (toolkit.deploy.hf_folder.load_tokenizer): the byte
tokenizer (the manifest's key, or the description older exports hold) is plain bytes; any other tokenizer is transformers' own,
encoding as ``tokenizer(text)`` and decoding without special tokens, as a plain transformers user does."""

from __future__ import annotations

import json

import pytest

from toolkit.data.tokenizers import ByteTokenizer
from toolkit.deploy.hf_folder import BytesTokenizer, HFTokenizer, load_tokenizer
from toolkit.catalogue.model_format import ExportError


def test_the_byte_tokenizer_by_its_key_and_the_older_description_is_bytes(tmp_path):
    saved, described = tmp_path / "saved", tmp_path / "described"
    saved.mkdir()
    described.mkdir()
    ByteTokenizer().save(saved)
    (described / "tokenizer.json").write_text(json.dumps({"type": "bytes-v1", "vocab_size": 256}))
    for folder, key in ((saved, ByteTokenizer.key), (described, None)):
        tokenizer = load_tokenizer(folder, frozenset({2}), key)
        assert isinstance(tokenizer, BytesTokenizer) and tokenizer.eos_ids == {2}
        assert tokenizer.encode("héllo".encode()) == list("héllo".encode())
        assert tokenizer.decode([104, 0xC3, 0xA9, 0xFF]) == "hé\ufffd"


def test_another_tokenizer_encodes_and_decodes_as_plain_transformers(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "<eos>": 1, "hello": 2, "world": 3}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="<eos>").save_pretrained(tmp_path)
    tokenizer = load_tokenizer(tmp_path, frozenset({1}))
    plain = AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(tokenizer, HFTokenizer)
    assert tokenizer.encode(b"hello world") == plain("hello world")["input_ids"] == [2, 3]
    assert tokenizer.decode([2, 3, 1]) == plain.decode([2, 3, 1], skip_special_tokens=True) == "hello world"


def test_a_folder_without_a_tokenizer_is_refused_naming_it(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ExportError, match=r"^model: .* has no tokenizer transformers can load"):
        load_tokenizer(tmp_path)
