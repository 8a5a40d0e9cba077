"""Key files (toolkit.key_files): made whole and private, reused, replaced when bad, refused when not ours."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from toolkit import key_files
from toolkit.key_files import KeyFileError


def test_a_key_is_made_private_whatever_the_umask_and_then_reused(tmp_path):
    old = os.umask(0)
    try:
        made = key_files.ensure(tmp_path / "key", "the key")
    finally:
        os.umask(old)
    assert made.mode == 0o600 and stat.S_IMODE((tmp_path / "key").stat().st_mode) == 0o600 and "made" in made.note
    again = key_files.ensure(tmp_path / "key", "the key")
    assert again.key == made.key and again.note == "" and key_files.read(tmp_path / "key", "the key") == made.key


def test_processes_racing_to_make_a_key_all_get_the_same_one(tmp_path):
    start, found = threading.Barrier(8), []

    def make():
        start.wait()
        found.append(key_files.ensure(tmp_path / "key", "the key").key)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(found)) == 1 and found[0] == (tmp_path / "key").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["key"]  # no temporary file left


@pytest.mark.parametrize("content, mode, problem", [
    ("", 0o600, "is empty"),
    ("short", 0o600, "does not hold a key"),
    ("x" * 10_000, 0o600, "does not hold a key"),
    ("A" * 43, 0o644, "mode 0644"),
    ("A" * 43, 0o620, "mode 0620"),
])
def test_a_bad_key_is_never_read_and_is_replaced_saying_why(tmp_path, content, mode, problem):
    path = tmp_path / "key"
    path.write_text(content)
    os.chmod(path, mode)
    with pytest.raises(KeyFileError, match=problem):
        key_files.read(path, "the key")
    replaced = key_files.ensure(path, "the key")
    assert problem in replaced.note and replaced.key != content.strip() and replaced.mode == 0o600
    assert key_files.read(path, "the key") == replaced.key


@pytest.mark.parametrize("make, kind", [
    (lambda p, t: p.symlink_to(t), "is a link"),
    (lambda p, t: os.mkfifo(p), "not a regular file"),
    (lambda p, t: p.mkdir(), "is a folder"),
])
def test_what_is_not_a_regular_file_is_refused_and_left_alone(tmp_path, make, kind):
    target = tmp_path / "target"
    target.write_text("A" * 43)
    path = tmp_path / "key"
    make(path, target)
    for call in (key_files.read, key_files.ensure):
        with pytest.raises(KeyFileError, match=kind):
            call(path, "the key")
    assert target.read_text() == "A" * 43 and os.path.lexists(path)
