"""What a data file holds, read without a tokenizer or a run: JSON Lines documents, instruction pairs and labelled
examples (bad lines named by file and line), the format's cache tag, token dtypes, how a long example is cut to a
row, and the bits-per-byte arithmetic."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest

from toolkit.data.corpus import bits_per_byte, bytes_per_token, fit_example
from toolkit.data.documents import (
    DataFormat, DataFormatError, LabelKinds, file_records, label_ids, table_records)
from toolkit.data.token_files import PIECE_CHARS, pieces_of, token_dtype

TEXT = DataFormat("text", text_field="text")
PAIRS = DataFormat("instruction", prompt_field="q", completion_field="a")
LABELLED = DataFormat("labelled", text_field="text", label_field="label")
WHERE = "'train.jsonl' of qa:1"


def test_a_plain_file_is_one_document_and_a_jsonl_file_one_per_line():
    assert file_records("notes.txt", b"line one\n\nline two", TEXT, WHERE) == [b"line one\n\nline two"]
    data = b'{"text": "first"}\n\n  \n{"text": "second", "other": 1}\r\n{"text": ""}\n'
    assert file_records("docs.JSONL", data, TEXT, WHERE) == ["first", "second", ""]


@pytest.mark.parametrize("data, problem", [
    (b'{"text": "ok"}\n{"text": "ok",}\n', "line 2 of 'train.jsonl' of qa:1 is not JSON (Expecting"),
    (b'{"text": "ok"}\n\n[1, 2]\n', "line 3 of 'train.jsonl' of qa:1 is [1, 2], not a JSON object"),
    (b'"just a string"\n', "line 1 of 'train.jsonl' of qa:1 is 'just a string', not a JSON object"),
    (b'{"body": "no text field"}\n', "line 1 of 'train.jsonl' of qa:1 has no field 'text'"),
    (b'{"text": 3}\n', "line 1 of 'train.jsonl' of qa:1 has 3, not a string, in field 'text'"),
    (b'{"text": null}\n', "line 1 of 'train.jsonl' of qa:1 has None, not a string, in field 'text'"),
    (b'{"text": "caf\xe9"}\n', "line 1 of 'train.jsonl' of qa:1 is not UTF-8"),
])
def test_a_bad_jsonl_line_is_refused_naming_file_and_line(data, problem):
    with pytest.raises(DataFormatError) as refused:
        file_records("train.jsonl", data, TEXT, WHERE)
    assert problem in str(refused.value), refused.value
    assert str(refused.value).endswith("allowed: one JSON object per line with a string field 'text' (data.text_field)")


def test_instruction_lines_are_prompt_completion_pairs():
    data = b'{"q": "2+2=", "a": "4"}\n{"q": "", "a": "only a completion"}\n{"q": "no answer", "a": ""}\n'
    assert file_records("qa.jsonl", data, PAIRS, WHERE) == [("2+2=", "4"), ("", "only a completion"),
                                                            ("no answer", "")]


@pytest.mark.parametrize("name, data, problem", [
    ("qa.jsonl", b'{"q": "x"}\n', "line 1 of 'train.jsonl' of qa:1 has no field 'a'"),
    ("qa.jsonl", b'{"q": "", "a": ""}\n', "has an empty prompt and an empty completion"),
    ("qa.txt", b"plain text", "is not JSON Lines (its name does not end in .jsonl)"),
])
def test_instruction_data_that_cannot_be_pairs_is_refused(name, data, problem):
    with pytest.raises(DataFormatError, match="allowed: .*'q' \\(data.prompt_field\\) and 'a'") as refused:
        file_records(name, data, PAIRS, WHERE)
    assert problem in str(refused.value)


def test_labelled_lines_keep_their_label_and_line_number():
    data = b'{"text": "good", "label": 1}\n\n{"text": "bad", "label": 0}\n'
    assert file_records("l.jsonl", data, LABELLED, WHERE) == [("good", 1, 1), ("bad", 0, 3)]


@pytest.mark.parametrize("label, shown", [("true", "True"), ("-1", "-1"), ("1.5", "1.5"), ('""', "''"),
                                          ("[1]", "[1]")])
def test_a_label_that_is_no_class_is_refused(label, shown):
    with pytest.raises(DataFormatError, match=re.escape(f"line 1 of 'train.jsonl' of qa:1 has label {shown} in")):
        file_records("l.jsonl", b'{"text": "t", "label": ' + label.encode() + b"}\n", LABELLED, WHERE)
    with pytest.raises(DataFormatError, match="line 1 of .* has no label in 'label'"):
        file_records("l.jsonl", b'{"text": "t"}\n', LABELLED, WHERE)


def test_class_names_are_numbered_in_sorted_order_and_numbers_kept():
    ids, names = label_ids(["pos", "neg", "pos", "neutral"])
    assert names == ["neg", "neutral", "pos"] and ids.tolist() == [2, 0, 2, 1]
    ids, names = label_ids([3, 0, 1])
    assert names is None and ids.tolist() == [3, 0, 1] and ids.dtype == np.int64


def test_labels_mixing_numbers_and_names_are_refused_naming_both():
    kinds = LabelKinds()
    kinds.see(1, 1, "'a.jsonl'")
    kinds.see(0, 2, "'a.jsonl'")
    with pytest.raises(DataFormatError, match=r"mix class numbers \(first at line 1 of 'a.jsonl'\) and class names "
                                              r"\(first at row 7 of tbl:1\)"):
        kinds.see("pos", 7, "tbl:1", "row")


def test_a_table_gives_text_and_label_rows():
    frame = pd.DataFrame({"review": ["fine", "awful"], "stars": [1.0, 0.0], "other": [5, 6]})
    fmt = DataFormat("labelled", text_field="review", label_field="stars")
    assert table_records(frame, fmt, "reviews:1") == [("fine", 1, 1), ("awful", 0, 2)]
    with pytest.raises(DataFormatError, match=r"reviews:1 has no column 'text' \(its columns: review, stars, other\)"):
        table_records(frame, LABELLED, "reviews:1")
    gaps = pd.DataFrame({"review": ["fine", "?"], "stars": [1, None]})
    with pytest.raises(DataFormatError, match="row 2 of reviews:1 has no label in 'stars'"):
        table_records(gaps, fmt, "reviews:1")


def test_plain_text_has_no_format_tag_so_byte_level_token_files_keep_their_names():
    assert TEXT.tag(has_jsonl=False) == ""
    tags = {TEXT.tag(True), DataFormat("text", text_field="body").tag(True), PAIRS.tag(False), LABELLED.tag(False)}
    assert len(tags) == 4 and all(len(t) == 13 and t.startswith("-") for t in tags), tags
    assert TEXT.tag(True) == DataFormat("text", text_field="text").tag(True), "a pure function of the settings"


@pytest.mark.parametrize("vocab, dtype, suffix", [(2, np.uint8, "u8"), (256, np.uint8, "u8"), (257, np.uint16, "u16"),
                                                  (65536, np.uint16, "u16"), (65537, np.uint32, "u32"),
                                                  (128256, np.uint32, "u32")])
def test_token_files_use_the_narrowest_dtype_the_vocabulary_fits(vocab, dtype, suffix):
    assert token_dtype(vocab) == (dtype, suffix)
    assert np.iinfo(dtype).max >= vocab - 1


def test_a_long_example_keeps_completion_tokens_in_its_row():
    assert fit_example(3, 10, 16) == (0, 10), "fits: all of it"
    assert fit_example(8, 12, 10) == (2, 12), "a short completion: all of it, with the prompt's end before it"
    assert fit_example(5, 12, 10) == (0, 10), "a long completion: the prompt, then as much completion as fits"
    assert fit_example(100, 110, 10) == (95, 105), "a long prompt: half the row for it, half for the completion"
    assert fit_example(0, 50, 10) == (0, 10), "no prompt: the completion's beginning"
    for prompt_len in range(0, 30):
        for length in range(prompt_len + 1, 40):
            start, stop = fit_example(prompt_len, length, 9)
            assert 0 <= start <= stop <= length and stop - start == min(length, 9)
            completion_in_row = stop - max(start, prompt_len)
            assert completion_in_row >= min(length - prompt_len, 9 - 9 // 2), (prompt_len, length)


def test_bits_per_byte_is_loss_per_token_times_tokens_per_byte_of_the_validation_split():
    lengths = np.array([0, 1, 2, 3])  # id 0 stands for no bytes (an end-of-text token), id 3 for three
    tokens = np.array([1, 3, 3, 0, 2], dtype=np.uint16)
    assert bytes_per_token(lengths, tokens) == 9 / 5

    class Val:
        bytes_per_item = 9 / 5

    assert bits_per_byte(2.0, Val) == pytest.approx(2.0 / math.log(2) * 5 / 9)
    Val.bytes_per_item = None
    assert bits_per_byte(2.0, Val) is None


def test_a_long_text_is_cut_after_newlines_into_pieces_that_join_to_it():
    line = "x" * 999 + "\n"
    text = line * (3 * PIECE_CHARS // len(line)) + "tail without newline"
    pieces = pieces_of(text)
    assert "".join(pieces) == text and len(pieces) >= 3
    assert all(len(p) <= PIECE_CHARS and p.endswith("\n") for p in pieces[:-1])
    assert pieces_of("short") == ["short"] and pieces_of("") == [""]


def test_jsonl_is_read_a_run_of_lines_at_a_time_hashed_as_read_and_a_huge_line_refused_unread(monkeypatch):
    import hashlib
    import io
    import json

    from toolkit.data import sources

    data = b"".join(json.dumps({"text": f"line {i}"}).encode() + b"\n" for i in range(500)) + b'{"text": "last"}'
    monkeypatch.setattr(sources, "JSONL_RUN_BYTES", 1000)
    hasher = hashlib.sha256()
    runs = list(sources._jsonl_runs(io.BytesIO(data), hasher, TEXT, WHERE))
    assert len(runs) > 10 and max(size for _, size in runs) < 1000 + 30  # bounded by the run, not the file
    assert [r for records, _ in runs for r in records] == file_records("d.jsonl", data, TEXT, WHERE)
    assert sum(size for _, size in runs) == len(data) and hasher.hexdigest() == hashlib.sha256(data).hexdigest()

    monkeypatch.setattr(sources, "MAX_LINE_BYTES", 100)
    huge = io.BytesIO(b'{"text": "ok"}\n' + b"\0" * 10_000)
    with pytest.raises(DataFormatError, match=f"line 2 of {re.escape(WHERE)} is over 100 bytes"):
        list(sources._jsonl_runs(huge, hashlib.sha256(), TEXT, WHERE))
    assert huge.tell() < 200  # the rest of the line never read


def test_a_plain_text_file_over_the_cap_is_refused_unread(tmp_path, monkeypatch):
    import hashlib

    from toolkit.data import sources

    monkeypatch.setattr(sources, "MAX_DOCUMENT_BYTES", 1000)
    (tmp_path / "book.txt").write_bytes(b"x" * 1001)
    with open(tmp_path / "book.txt", "rb") as f:
        with pytest.raises(DataFormatError, match="is 1,001 bytes, over the 1,000"):
            list(sources._document(f, hashlib.sha256(), "book.txt", TEXT, WHERE))
        assert f.tell() == 0  # not read
