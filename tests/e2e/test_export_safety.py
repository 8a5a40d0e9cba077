"""Exports are safe to write and to serve: `--out` never replaces what is not an export, `model/` is never missing
or partial (a reader spinning beside a re-export, SIGKILL at random points of export and re-export), and a served
folder is checked byte for byte against its manifest. One real tiny training run serves the whole module."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import PROJECT, cli
from toolkit.deploy.export import export_run
from toolkit.fsio import staging_folder
from toolkit.catalogue.model_format import FORMAT, MANIFEST, ExportError, publish_folder, read_manifest, verify_model_folder
from toolkit.rundir import RunDir
from toolkit.deploy.serving.runtimes import load_runtime


@pytest.fixture
def trained(finished_runs) -> RunDir:
    """The built-in tiny config trained 20 steps with a checkpoint at the end: test_export's shared run, read only.
    Tests that change the run work on a copy (:func:`_copy`); every export here goes to a folder of the test's."""
    return finished_runs("--set", "train.max_steps=20", "--set", "train.eval_every=20")


def _copy(run: RunDir, dest: Path) -> RunDir:
    shutil.copytree(run.path, dest, symlinks=True)
    return RunDir(dest)


# --- --out ----------------------------------------------------------------------------------------------------------

def test_export_refuses_an_out_that_is_not_an_export_before_any_work(trained, tmp_path):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    proc = cli("export", str(trained.path), "--out", str(mine))
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: --out: '{mine}' exists and is not a model folder (no {MANIFEST}); allowed: a new "
                           f"or empty folder, or an earlier model folder (it holds {MANIFEST} and only the files that "
                           "lists; it is replaced)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"], "nothing written beside it either"
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"] and (mine / "thesis.tex").read_text() == "years of work"

    # Checked before the checkpoint is even read: a run without one is refused for --out, not for the checkpoint.
    empty_run = _copy(trained, tmp_path / "no-checkpoints")
    shutil.rmtree(empty_run.path / "checkpoints")
    with pytest.raises(ExportError, match=f"^--out: '{mine}' exists and is not a model folder"):
        export_run(empty_run.path, out=mine)

    # A link is never written through or replaced, whatever it points at: an earlier export, or a folder of the
    # user's that a copied run's model/ points to.
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / MANIFEST).write_text("{}")
    (tmp_path / "link").symlink_to(earlier)
    with pytest.raises(ExportError, match=f"^--out: '{tmp_path / 'link'}' is a symbolic link; allowed: a real folder"):
        export_run(trained.path, out=tmp_path / "link")
    crafted = _copy(trained, tmp_path / "crafted")
    (crafted.path / "model").symlink_to(mine)
    with pytest.raises(ExportError, match=f"^--out: '{crafted.path / 'model'}' is a symbolic link"):
        export_run(crafted.path)
    assert [p.name for p in earlier.iterdir()] == [MANIFEST] and [p.name for p in mine.iterdir()] == ["thesis.tex"]
    assert (crafted.path / "model").is_symlink()
    assert not [p for p in [*tmp_path.iterdir(), *crafted.path.iterdir()] if p.name.startswith(".")], "no staging"


# --- what is served is what was exported ----------------------------------------------------------------------------

def _flip_a_byte(path: Path) -> bytes:
    original = path.read_bytes()
    changed = bytearray(original)
    changed[len(changed) // 2] ^= 0x01
    path.write_bytes(bytes(changed))
    return original


def test_a_changed_byte_in_an_export_is_refused_where_it_is_served(trained, tmp_path):
    model_dir = export_run(trained.path, out=tmp_path / "model").path
    assert verify_model_folder(model_dir) == read_manifest(model_dir)
    for runtime, weights in (("onnx", "model.onnx"), ("torch", "model.safetensors")):
        assert load_runtime(model_dir, runtime).forward(np.zeros((1, 4), "int64")).shape == (1, 4, 256)
        for name in (weights, "config.yaml"):
            original = _flip_a_byte(model_dir / name)
            with pytest.raises(ExportError, match=f"^model: '{model_dir}' has {name} whose sha256 differs from "
                                                  f"{MANIFEST}"):
                load_runtime(model_dir, runtime)
            (model_dir / name).write_bytes(original)
    (model_dir / "model.onnx.data").write_bytes(b"\0" * 64)  # external weights ONNX Runtime would pick up
    with pytest.raises(ExportError, match="holds model.onnx.data, which trainbook-model.json does not list"):
        load_runtime(model_dir, "onnx")


# --- model/ is never missing or partial -----------------------------------------------------------------------------

WATCHER = r"""
import os, sys
folder, stop = sys.argv[1], sys.argv[1] + ".stop"
manifest = os.path.join(folder, "trainbook-model.json")
samples = missing = 0
print("ready", flush=True)
while not os.path.exists(stop):
    samples += 1
    missing += not os.path.exists(manifest)
print(samples, missing, flush=True)
"""


def _publish(out: Path, files: dict[str, bytes]) -> None:
    """A small folder in the export format (a manifest listing its files), published the way exports are."""
    with staging_folder(out) as tmp:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        listed = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
        (tmp / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": listed}))
        publish_folder(tmp, out)


def test_a_reader_spinning_beside_re_exports_never_finds_the_model_folder_missing(tmp_path):
    """Two renames (old aside, new in) left ``model/`` missing for microseconds on every re-export: a reader on
    the other core found it missing 346 to 1,231 times in 200 re-exports. One renameat2(RENAME_EXCHANGE) leaves
    no such moment."""
    out = tmp_path / "model"
    _publish(out, {"model.onnx": b"0" * 4096})
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert watcher.stdout.readline() == "ready\n"
        for i in range(200):
            _publish(out, {"model.onnx": str(i).encode() * 4096, "config.yaml": b"model: {}\n"})
    finally:
        Path(f"{out}.stop").touch()
        samples, missing = map(int, watcher.stdout.readline().split())
        watcher.wait(timeout=30)
    assert samples > 1000, "the reader ran beside the re-exports"
    assert missing == 0, f"model/ was missing in {missing} of {samples} looks during 200 re-exports"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.stop"], "no staging folder left"


# A re-export child for the crash test: the export's own staging and publishing (toolkit.fsio through
# toolkit.catalogue.model_format, which export_run calls) over the files of a real export, with parity.json and the manifest
# made its own so that no two re-exports are alike and a mix of two would fail the check. Building the files again
# (ONNX, ~8 s) would change nothing in what a kill can leave behind; one real `trainbook export` is killed
# mid-build too.
RE_EXPORT = r"""
import json, shutil, sys
from pathlib import Path
from toolkit.fsio import sha256_file
from toolkit.fsio import staging_folder
from toolkit.catalogue.model_format import MANIFEST, publish_folder
source, out, tag = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
print("ready", flush=True)
sys.stdin.readline()  # "go": the test starts its clock
with staging_folder(out) as tmp:
    manifest = json.loads((source / MANIFEST).read_text())
    for name in manifest["files"]:
        shutil.copyfile(source / name, tmp / name)
    (tmp / "parity.json").write_text(json.dumps({**json.loads((tmp / "parity.json").read_text()), "re_export": tag}))
    manifest["files"]["parity.json"] = {"sha256": sha256_file(tmp / "parity.json"),
                                        "size": (tmp / "parity.json").stat().st_size}
    (tmp / MANIFEST).write_text(json.dumps({**manifest, "re_export": tag}))
    publish_folder(tmp, out)
"""


def _start(argv: list[str]) -> tuple[subprocess.Popen, int]:
    """A child process and a pidfd that becomes readable when it ends (an event to wait on, with a timeout)."""
    child = subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=PROJECT)
    return child, os.pidfd_open(child.pid)


def _end(child: subprocess.Popen, pidfd: int, kill_at: float | None) -> str:
    """SIGKILL the child at the monotonic time ``kill_at`` unless it has ended by then (None: let it end); how it
    ended."""
    timeout = None if kill_at is None else max(0.0, kill_at - time.monotonic())
    if not select.select([pidfd], [], [], timeout)[0]:
        child.send_signal(signal.SIGKILL)
    os.close(pidfd)
    _, err = child.communicate(timeout=60)
    return "killed" if child.returncode == -signal.SIGKILL else f"exit {child.returncode} {err[-2000:]}".strip()


def _new_entries(run: RunDir, known: set[str]) -> list[str]:
    return sorted(p.name for p in run.path.iterdir() if p.name not in known)


def _check_after_kills(run: RunDir, known: set[str], completed: bool, log: list[str]) -> bool:
    """model/ is absent (only while no export has completed) or passes the model-folder check; beside it are only
    hidden staging folders. Returns whether model/ exists."""
    history = "\n".join(log)
    model = run.path / "model"
    leftovers = [n for n in _new_entries(run, known) if n != "model"]
    assert all(n.startswith(".model.") and n.endswith(".tmp") and (run.path / n).is_dir() for n in leftovers), (
        f"only hidden staging folders beside model/: {leftovers}\n{history}")
    if not model.exists():
        assert not completed, f"model/ went missing after an export had completed\n{history}"
        return False
    assert not model.is_symlink(), history
    try:
        manifest = verify_model_folder(model)
    except ExportError as exc:
        pytest.fail(f"model/ is not a complete export: {exc}\n{history}")
    log.append(f"  model/ holds export {manifest.get('re_export', 'by trainbook export')}; {len(leftovers)} staging "
               "folder(s) beside it")
    return True


ROUNDS = 8  # two re-export children at once in each, as two people re-exporting one run would


def _re_exports(source: Path, run: RunDir, tags: list[str]) -> tuple[list[tuple[subprocess.Popen, int]], float]:
    """Re-export children, imports done, told to go at once: ([(process, pidfd)], when they were told)."""
    children = [_start(["-c", RE_EXPORT, str(source), str(run.path / "model"), tag]) for tag in tags]
    for child, _ in children:
        assert child.stdout.readline() == "ready\n", child.stderr.read()
    for child, _ in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    return children, time.monotonic()


def test_exports_killed_at_random_points_leave_model_absent_or_complete(trained, tmp_path, rng):
    """SIGKILL after seeded random delays: one real `trainbook export` anywhere in its build, then 16 re-exports
    anywhere in staging, copying, fsync, swap and removal of the previous folder (the window is measured on one
    re-export first). After every kill model/ is absent (no export has completed yet) or passes the model-folder
    check, and beside it are only hidden staging folders; at the end a real export completes, verifies, and has
    removed every leftover."""
    run = _copy(trained, tmp_path / "run")
    known = {p.name for p in run.path.iterdir()}
    source = export_run(run.path, out=tmp_path / "source").path  # real files for the re-export children
    log, completed = ["(the seed to replay is in the captured setup output)"], False

    delay = rng.uniform(0, 6)
    child, pidfd = _start(["-m", "toolkit", "export", str(run.path)])
    log.append(f"trainbook export: SIGKILL at +{delay:.2f} s -> {_end(child, pidfd, time.monotonic() + delay)}")
    completed = _check_after_kills(run, known, completed, log)
    [(child, pidfd)], go = _re_exports(source, run, ["calibration"])
    assert _end(child, pidfd, None) == "exit 0"
    alone = time.monotonic() - go  # staging, copy, fsyncs, swap, removal: ~30 ms here
    window = 2 * alone  # two at once on two cores (and other work) take longer
    log.append(f"a re-export takes {alone * 1000:.1f} ms alone; kills fall in the first {window * 1000:.1f} ms")
    completed = _check_after_kills(run, known, True, log)
    for round_ in range(ROUNDS):
        children, go = _re_exports(source, run, [f"{round_}.{n}" for n in (0, 1)])
        delays = [rng.uniform(0, window) for _ in children]
        for n in sorted((0, 1), key=lambda n: delays[n]):
            status = _end(*children[n], go + delays[n])
            log.append(f"re-export {round_}.{n}: SIGKILL at +{delays[n] * 1000:.1f} ms -> {status}")
            assert status in ("killed", "exit 0"), "\n".join(log)
        completed = _check_after_kills(run, known, completed, log) or completed

    final = export_run(run.path)
    history = "\n".join(log)
    assert verify_model_folder(final.path) == final.manifest and "re_export" not in final.manifest, history
    assert _new_entries(run, known) == ["model"], f"the final export removed every leftover\n{history}"
