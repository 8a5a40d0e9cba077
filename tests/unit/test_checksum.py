"""The one-pass checksummed writer: torch.save into it, and what it reports is what is on disk."""

import os

import pytest
import torch

from toolkit.checkpoint.checksum import (BLOCK, BOUNCE_BYTES, CHECKPOINT_CHECKSUM, ChecksummedWriter, bounce_buffer,
                              entry_checksum, file_checksum)
from toolkit.fsio import sha256_file


@pytest.fixture(scope="module")
def bounce():
    return bounce_buffer()


@pytest.mark.parametrize("nbytes", [0, 1, BLOCK - 1, BLOCK, BOUNCE_BYTES - 7, BOUNCE_BYTES, BOUNCE_BYTES + BLOCK + 3])
def test_every_length_lands_whole_and_its_checksum_is_the_files(tmp_path, bounce, nbytes):
    data = os.urandom(nbytes)
    writer = ChecksummedWriter(tmp_path / "f.bin", bounce)
    for start in range(0, nbytes, 1_000_003):  # odd-sized writes straddle the bounce buffer's edge
        writer.write(memoryview(data)[start:start + 1_000_003])
    entry = writer.close()
    assert (tmp_path / "f.bin").read_bytes() == data
    assert entry == {"size": nbytes, CHECKPOINT_CHECKSUM: file_checksum(tmp_path / "f.bin")}


def test_torch_save_through_the_writer_loads_back(tmp_path, bounce):
    state = {"w": torch.randn(300, 257), "step": 3, "b": torch.arange(10, dtype=torch.bfloat16)}
    writer = ChecksummedWriter(tmp_path / "s.pt", bounce)
    torch.save(state, writer)
    entry = writer.close()
    loaded = torch.load(tmp_path / "s.pt", weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"]) and loaded["step"] == 3
    assert entry_checksum(entry) == (CHECKPOINT_CHECKSUM, file_checksum(tmp_path / "s.pt"))


def test_buffered_fallback_without_a_bounce_buffer(tmp_path):
    writer = ChecksummedWriter(tmp_path / "b.bin", None)
    writer.write(b"abc")
    assert not writer.direct and writer.close()["size"] == 3 and (tmp_path / "b.bin").read_bytes() == b"abc"


def test_a_link_in_the_files_place_is_not_written_through(tmp_path, bounce):
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    (tmp_path / "f.pt").symlink_to(target)
    with pytest.raises(OSError):
        ChecksummedWriter(tmp_path / "f.pt", bounce)
    assert target.read_text() == "keep me"


def test_manifest_entries_from_before_and_after_the_change_are_both_read(tmp_path):
    (tmp_path / "x").write_bytes(b"hello")
    old = {"size": 5, "sha256": sha256_file(tmp_path / "x")}
    new = {"size": 5, CHECKPOINT_CHECKSUM: file_checksum(tmp_path / "x")}
    assert entry_checksum(old) == ("sha256", old["sha256"])
    assert entry_checksum(new) == (CHECKPOINT_CHECKSUM, new[CHECKPOINT_CHECKSUM])
    assert file_checksum(tmp_path / "x", "sha256") == old["sha256"]


@pytest.mark.parametrize("entry", [
    {"size": 5}, {"size": 5, "sha256": "ab"}, {"size": -1, "xxh3_128": "0" * 32}, {"size": True, "xxh3_128": "0" * 32},
    {"size": 5, "xxh3_128": "0" * 32, "sha256": "0" * 64}, {"size": 5, "md5": "0" * 32}, "not a dict",
    {"size": 5, "xxh3_128": "Z" * 32},
])
def test_malformed_entries_are_refused(entry):
    assert entry_checksum(entry) is None


def test_abort_after_close_closes_nothing_else(tmp_path, bounce):
    """An error path always calls abort(); after close() it must not close a descriptor number reused since."""
    writer = ChecksummedWriter(tmp_path / "f.bin", bounce)
    writer.write(b"x" * 10)
    writer.close()
    reused = os.open(tmp_path / "other", os.O_CREAT | os.O_WRONLY)  # likely the number the writer had
    writer.abort()
    writer.abort()
    os.write(reused, b"still open")
    os.close(reused)
