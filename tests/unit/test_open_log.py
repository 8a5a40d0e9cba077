"""fsio.open_log, how every log of a run directory is opened: a copied run directory may hold planted links."""

import os

import pytest

from toolkit.fsio import open_log


def test_appends_and_fresh_replaces(tmp_path):
    path = tmp_path / "train.log"
    for line in (b"one\n", b"two\n"):
        with open_log(path) as log:
            log.write(line)
    assert path.read_bytes() == b"one\ntwo\n"
    with open_log(path, text=True, fresh=True) as log:
        log.write("three\n")
    assert path.read_text() == "three\n"


def test_a_planted_link_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "outside.txt"
    target.write_text("precious")
    os.symlink(target, tmp_path / "events.jsonl")
    with pytest.raises(OSError, match="events.jsonl: .* is a link; allowed: a regular file"):
        open_log(tmp_path / "events.jsonl", text=True)
    assert target.read_text() == "precious"


def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "train.log")
    with pytest.raises(OSError, match="is not a regular file"):
        open_log(tmp_path / "train.log")
