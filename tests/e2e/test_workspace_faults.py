"""A workspace that is damaged or that this user cannot write, driven through the CLI as a user meets it: a corrupt
catalogue is one line naming the file and what to do (never a traceback, never rewritten), and a read-only workspace
still answers every verb that only looks while every verb that writes says it is read-only."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import cli

CATALOGUE = "catalogue.sqlite"


def _workspace_with_an_asset(tmp_path) -> tuple[Path, Path]:
    """(workspace folder, a source file) with the source registered as notes:1, through the CLI."""
    source = tmp_path / "notes.txt"
    source.write_text("some notes\n" * 50)
    ws = tmp_path / "ws"
    proc = cli("data", "--workspace", str(ws), "register", "notes", str(source))
    assert proc.returncode == 0 and proc.stdout.strip() == "notes:1", proc.stdout + proc.stderr
    return ws, source


def _bad_header(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(b"this is not SQL!" + data[16:])  # the 16-byte "SQLite format 3\0" magic, overwritten


def _truncated(db: Path) -> None:
    data = db.read_bytes()
    assert len(data) >= 3 * 4096, "a catalogue of several pages, so cutting it loses tables"
    db.write_bytes(data[:len(data) // 2])  # a copy cut short (a full disk, an interrupted transfer)


def _user_verbs(ws: Path, source: Path) -> dict[str, list[str]]:
    """Verbs that open the catalogue, each as a user types it."""
    return {"data list": ["data", "--workspace", str(ws), "list"],
            "data show": ["data", "--workspace", str(ws), "show", "notes"],
            "runs": ["runs", "--workspace", str(ws)],
            "models": ["models", "--workspace", str(ws)],
            "data register": ["data", "--workspace", str(ws), "register", "more", str(source)],
            "serve": ["serve", "notes", "--workspace", str(ws)]}


@pytest.mark.parametrize("damage", [_bad_header, _truncated], ids=["bad-header", "truncated"])
def test_a_corrupt_catalogue_is_one_line_naming_it_and_what_to_do(tmp_path, damage):
    ws, source = _workspace_with_an_asset(tmp_path)
    db = ws / CATALOGUE
    damage(db)
    before = db.read_bytes()
    for verb, args in _user_verbs(ws, source).items():
        proc = cli(*args)
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2 and len(lines) == 1, f"{verb}: rc {proc.returncode}\n{proc.stderr}"
        assert lines[0].startswith(f"error: workspace: the catalogue '{db}' is damaged"), f"{verb}: {lines[0]}"
        assert "move it aside" in lines[0] and "backup" in lines[0], f"{verb}: says what to do: {lines[0]}"
    assert db.read_bytes() == before, "the damaged catalogue is left as it was found, for the user to rescue"

    db.rename(db.with_name(CATALOGUE + ".damaged"))  # what the message says to do
    again = cli("data", "--workspace", str(ws), "register", "notes", str(source))
    assert again.returncode == 0 and again.stdout.strip() == "notes:1", again.stdout + again.stderr


@contextlib.contextmanager
def _read_only(folder: Path):
    """``folder`` made unwritable for this user for the block: its mode without write bits, or, for root (whom modes
    do not stop), the immutable attribute, which stops root too."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        restore = ["chmod", "755", str(folder)]
    elif shutil.which("chattr") and subprocess.run(["chattr", "+i", str(folder)]).returncode == 0:
        restore = ["chattr", "-i", str(folder)]
    else:
        pytest.skip("running as root where `chattr +i` is not available: no way to make a folder read-only to root")
    try:
        probe = folder / "probe"
        with pytest.raises(PermissionError):
            probe.write_text("x")  # really read-only to this user
        yield folder
    finally:
        subprocess.run(restore, check=True)


def _entries(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def test_a_read_only_workspace_answers_every_looking_verb_and_refuses_writes_in_one_line(tmp_path):
    ws, source = _workspace_with_an_asset(tmp_path)
    before = _entries(ws)
    with _read_only(ws):
        looking = {"data list": (["data", "--workspace", str(ws), "list"], "notes:1"),
                   "data list --json": (["data", "--workspace", str(ws), "list", "--json"], '"ref": "notes:1"'),
                   "data show": (["data", "--workspace", str(ws), "show", "notes"], "notes:1"),
                   "data verify": (["data", "--workspace", str(ws), "verify"], "no problems"),
                   "runs": (["runs", "--workspace", str(ws)], "no runs"),
                   "models": (["models", "--workspace", str(ws)], "no models")}
        for verb, (args, expected) in looking.items():
            proc = cli(*args)
            assert proc.returncode == 0 and expected in proc.stdout, f"{verb}: rc {proc.returncode}\n{proc.stderr}"
        writing = {"data register": ["data", "--workspace", str(ws), "register", "more", str(source)],
                   "data archive": ["data", "--workspace", str(ws), "archive", "notes:1"],
                   "data verify --repair": ["data", "--workspace", str(ws), "verify", "--repair"]}
        for verb, args in writing.items():
            proc = cli(*args)
            lines = proc.stderr.splitlines()
            assert proc.returncode == 2 and len(lines) == 1, f"{verb}: rc {proc.returncode}\n{proc.stderr}"
            assert lines[0].startswith(f"error: workspace: '{ws}' is read-only"), f"{verb}: {lines[0]}"
        assert _entries(ws) == before, "nothing in the workspace was created or changed"
    listed = cli("data", "--workspace", str(ws), "list")
    assert "notes:1" in listed.stdout and "more" not in listed.stdout, "no write got through"
