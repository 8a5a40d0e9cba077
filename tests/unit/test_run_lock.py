"""One run directory, one run: the run lock refuses a second holder and is free again once its holder closes it."""

from __future__ import annotations

import os

import pytest

from toolkit import run_lock


def test_a_second_holder_is_refused_naming_the_run_dir_and_the_holders_pid(tmp_path):
    fd = run_lock.acquire(tmp_path / "r")
    try:
        run_lock.record_holder(fd, 4242)
        with pytest.raises(run_lock.RunBusyError, match=rf"run_dir: '{tmp_path / 'r'}' is in use by another run "
                                                        r"\(pid 4242\)"):
            run_lock.acquire(tmp_path / "r")
    finally:
        os.close(fd)
    os.close(run_lock.acquire(tmp_path / "r"))  # its holder gone, the directory is free again


def test_a_planted_link_is_not_followed(tmp_path):
    outside = tmp_path / "precious"
    outside.write_text("keep me")
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / run_lock.LOCK_NAME).symlink_to(outside)
    with pytest.raises(ValueError, match="run.lock: .* is a link; allowed: a regular file of the run directory"):
        run_lock.acquire(tmp_path / "r")
    assert outside.read_text() == "keep me"


def test_a_planted_fifo_is_refused_and_leaves_no_descriptor_open(tmp_path):
    import os

    os.mkfifo(tmp_path / run_lock.LOCK_NAME)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError, match="is not a regular file"):
        run_lock.acquire(tmp_path)
    assert len(os.listdir("/proc/self/fd")) == before
