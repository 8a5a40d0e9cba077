"""The endpoint's key file, as `trainbook serve` meets it: an empty, truncated, shared or linked key never turns
authentication off, and a full disk never leaves a half-written key behind."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROJECT, cli
from toolkit.catalogue.workspace import Workspace
from served_model import exported_tiny_model

from test_serving import call


@pytest.fixture(scope="module")
def model_dir(finished_runs):
    return exported_tiny_model(finished_runs)


def key_path(ws: Path) -> Path:
    return ws / "endpoints" / "tiny" / "key"


@contextlib.contextmanager
def serving(model_dir: Path, ws: Path):
    """`trainbook serve` until the block ends (then Ctrl-C): yields (scoring URL, stderr lines so far)."""
    proc = subprocess.Popen([sys.executable, "-m", "toolkit", "serve", str(model_dir), "--runtime", "torch",
                             "--workspace", str(ws)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=PROJECT)
    output = {"first": proc.stdout.readline()}  # printed once the endpoint answers
    try:
        assert output["first"], proc.communicate(timeout=30)[1]
        yield output["first"].split(": ", 1)[1].split(" ")[0], output
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.stdout.read(), proc.stderr.read()  # not communicate(): it would skip what readline buffered
        proc.wait(timeout=30)
        output.update(out=output["first"] + out, err=err)


def ask(url: str, token: str) -> int:
    status, _ = call(url, {"prompt": "def ", "max_new_tokens": 2}, {"Authorization": f"Bearer {token}"})
    return status


@pytest.mark.parametrize("planted, why", [
    ("", "is empty"),                              # `: > key`, or a write that failed on a full disk
    ("abc", "does not hold a key"),                # truncated
])
def test_an_empty_or_truncated_key_file_is_replaced_never_served(model_dir, tmp_path, planted, why):
    ws = tmp_path / "ws"
    key_path(ws).parent.mkdir(parents=True)
    key_path(ws).write_text(planted)
    os.chmod(key_path(ws), 0o600)
    with serving(model_dir, ws) as (url, output):
        assert ask(url, planted) == 401, "the planted key is not a key the endpoint accepts"
        assert ask(url, "") == 401
        key = key_path(ws).read_text()
        assert len(key) == 43 and ask(url, key) == 200
    assert why in output["err"] and "replaced it with a new key" in output["err"], output["err"]
    assert key not in output["out"] + output["err"]


def test_a_key_file_readable_by_others_is_replaced_and_the_mode_is_reported(model_dir, tmp_path):
    ws = tmp_path / "ws"
    with serving(model_dir, ws) as (url, output):
        old = key_path(ws).read_text()
        assert ask(url, old) == 200
    assert "key file (0600)" in output["out"] and "replaced" not in output["err"], output
    os.chmod(key_path(ws), 0o644)
    with serving(model_dir, ws) as (url, output):
        assert ask(url, old) == 401, "a key others could read is not accepted any more"
        new = key_path(ws).read_text()
        assert new != old and ask(url, new) == 200
    assert "mode 0644" in output["err"] and "replaced it with a new key" in output["err"], output["err"]
    assert "key file (0600)" in output["out"] and stat.S_IMODE(key_path(ws).stat().st_mode) == 0o600


def test_a_key_file_that_is_a_link_is_refused_and_its_target_left_alone(model_dir, tmp_path):
    ws = tmp_path / "ws"
    elsewhere = tmp_path / "not-a-key.txt"
    elsewhere.write_text("someone else's file\n")
    key_path(ws).parent.mkdir(parents=True)
    key_path(ws).symlink_to(elsewhere)
    proc = cli("serve", str(model_dir), "--runtime", "torch", "--workspace", str(ws), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"the endpoint key {key_path(ws)}: is a link" in proc.stderr and "Traceback" not in proc.stderr
    assert elsewhere.read_text() == "someone else's file\n" and key_path(ws).is_symlink()


@pytest.mark.parametrize("linked", ["endpoints/tiny", "endpoints"])
def test_an_endpoint_folder_that_is_a_link_is_refused_and_nothing_is_written_through_it(model_dir, tmp_path, linked):
    # the key, the record and the log would land wherever the link points, and `endpoints` (which skips linked
    # folders) could neither list nor stop the server
    ws, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (ws / linked).parent.mkdir(parents=True)
    (ws / linked).symlink_to(elsewhere)
    proc = cli("serve", str(model_dir), "--runtime", "torch", "--workspace", str(ws), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"'{ws / linked}' is a symbolic link to '{elsewhere}'" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and list(elsewhere.iterdir()) == []


@pytest.mark.timeout(60)  # before the fix, reading the FIFO waited forever for a writer
def test_an_endpoint_record_that_is_a_fifo_or_a_link_is_not_listed_and_never_waited_on(tmp_path):
    ws = tmp_path / "ws"
    (ws / "endpoints" / "ghost").mkdir(parents=True)
    os.mkfifo(ws / "endpoints" / "ghost" / "endpoint.json")
    (ws / "endpoints" / "linked").mkdir()
    (ws / "endpoints" / "linked" / "endpoint.json").symlink_to("/dev/zero")
    Workspace.open(ws)  # the rest of a workspace: its catalogue
    proc = cli("endpoints", "--workspace", str(ws), timeout=50)
    assert proc.returncode == 0 and proc.stdout.startswith("no endpoints running"), proc.stdout + proc.stderr


def test_a_failed_key_write_leaves_no_empty_key_behind(model_dir, tmp_path):
    """A key write that fails half-way (a full disk; here the file-size limit, which fails the same write() with EFBIG
    where a full disk gives ENOSPC) leaves no key file, so the next serve makes a whole one. The limit would fail the
    catalogue's writes first, so the key is made by the function `serve` calls, in a process of its own."""
    ws = tmp_path / "ws"
    limited = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from toolkit.deploy.serving.endpoint import endpoint_key; endpoint_key(Path(sys.argv[1]))",
         str(key_path(ws).parent)],
        capture_output=True, text=True, cwd=PROJECT, timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16)))
    assert limited.returncode != 0 and "a new key cannot be written" in limited.stderr, limited.stderr
    assert not key_path(ws).exists(), "no key file is left behind"
    assert not [p.name for p in key_path(ws).parent.iterdir() if p.name.endswith(".tmp")]
    with serving(model_dir, ws) as (url, output):
        key = key_path(ws).read_text()
        assert len(key) == 43 and ask(url, key) == 200 and ask(url, "") == 401
