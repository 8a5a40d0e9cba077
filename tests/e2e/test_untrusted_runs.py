"""A run directory copied from elsewhere is data, not code: a checkpoint whose pickles would run code (with a
manifest whose hashes match them: a manifest proves nothing about who wrote the files) is listed as invalid, and
`export`, `resume` and every engine's loader refuse it without running anything."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from toolkit import safe_load
from toolkit.checkpoint.store import MANIFEST, describe_files
from toolkit.rundir import RunDir

from conftest import PROJECT, TWO_CHECKPOINTS, cli
from e2e.test_checkpoint import CKPT, FSDP_2_ACCUM
from unit.test_untrusted_checkpoints import RunsCode

ONE_CHECKPOINT = ("--set", "train.max_steps=5", "--set", "checkpoint.every_steps=5")

# Builds the run's engine in a process of its own (DeepSpeed needs a process group) and loads a checkpoint folder
# straight into it, past the listing's checks: the loaders themselves must refuse code.
LOAD_INTO_ENGINE = """
import os, sys
from pathlib import Path
from toolkit.train import distributed
from toolkit.train.engines import build_engine
from toolkit.train.models import build_model
from toolkit.rundir import RunDir
from toolkit.safe_load import UnsafeCheckpointError
os.environ.update(distributed.single_process_env())
cfg = RunDir(sys.argv[1]).read_config()
engine = build_engine(build_model(cfg.model), cfg, distributed.setup(cfg.engine))
try:
    engine.load_checkpoint_state(Path(sys.argv[2]))
except UnsafeCheckpointError as exc:
    print("refused:", exc)
    sys.exit(3)
"""


def plant(folder: Path, name: str, marker: Path) -> None:
    """Put a code-running object into checkpoint file ``name`` and make the manifest agree with the new bytes."""
    import torch

    state = safe_load.load(folder / name)
    state["planted"] = RunsCode(marker)
    torch.save(state, folder / name)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"].update(describe_files(folder, [name]))
    (folder / MANIFEST).write_text(json.dumps(manifest))


def load_into_engine(run: RunDir, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LOAD_INTO_ENGINE, str(run.path), str(folder)], capture_output=True,
                          text=True, timeout=300, cwd=PROJECT)


def test_a_planted_pickle_is_refused_by_checkpoints_export_resume_and_the_torch_loader(finished_run_copy, tmp_path):
    run = finished_run_copy(*ONE_CHECKPOINT)
    (folder,) = (run.path / "checkpoints").glob("step_*")
    marker = tmp_path / "code-ran"
    plant(folder, "rank_00000.pt", marker)

    listing = cli("checkpoints", str(run.path)).stdout
    assert "INVALID: rank_00000.pt: loading it would import posix.system" in listing, listing

    exported = cli("export", str(run.path))
    assert exported.returncode != 0 and "posix.system" in exported.stderr, exported.stderr
    assert not (run.path / "model").exists()

    run.write_status(state="failed")
    resumed = cli("resume", str(run.path))
    invalid = run.events("checkpoint_invalid")
    assert invalid and "posix.system" in invalid[-1]["reason"], (resumed.stderr, invalid)

    plant(folder, "model.pt", marker)  # the engine's own files, loaded directly
    loaded = load_into_engine(run, folder)
    assert loaded.returncode == 3 and "model.pt: loading it would import posix.system" in loaded.stdout, \
        loaded.stdout + loaded.stderr
    assert not marker.exists(), "a planted pickle ran"


@pytest.mark.slow
def test_a_planted_sharded_metadata_is_refused_by_checkpoints_export_and_the_fsdp_loader(finished_run_copy, tmp_path):
    """DCP unpickles a sharded checkpoint's .metadata with pickle.load: Trainbook reads it without running code."""
    run = finished_run_copy(*CKPT, *FSDP_2_ACCUM)  # the golden FSDP run's copy: checkpoints at steps 20, 30, 40
    newest = sorted((run.path / "checkpoints").glob("step_*"))[-1]
    marker, name = tmp_path / "code-ran", "shards/rank_00001/.metadata"
    (newest / name).write_bytes(pickle.dumps(RunsCode(marker)))
    manifest = json.loads((newest / MANIFEST).read_text())
    manifest["files"].update(describe_files(newest, [name]))
    (newest / MANIFEST).write_text(json.dumps(manifest))

    listing = cli("checkpoints", str(run.path)).stdout
    assert f"INVALID: {name}: loading it would import posix.system" in listing and listing.count("INVALID") == 1, \
        listing
    exported = cli("export", str(run.path), "--out", str(tmp_path / "model"))  # from the step before
    assert exported.returncode == 0 and "(step_00000030, fsdp)" in exported.stdout, exported.stdout + exported.stderr
    loaded = load_into_engine(run, newest)  # the engine's own reader, past the listing
    assert loaded.returncode == 3 and "names posix.system, which loading would import or call" in loaded.stdout, \
        loaded.stdout + loaded.stderr[-2000:]
    assert not marker.exists(), "a planted .metadata ran"


def replace_pickle(folder: Path, name: str, pickled: bytes) -> None:
    """Make checkpoint file ``name`` a torch.save zip whose data.pkl is ``pickled`` (its other records kept), and make
    the manifest agree with the new bytes."""
    import torch

    path = folder / name
    torch.save(safe_load.load(path), path)  # as torch.save writes it, then the pickle replaced
    records = {}
    with zipfile.ZipFile(path) as old:
        for info in old.infolist():
            records[info] = pickled if info.filename.endswith("/data.pkl") else old.read(info)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as new:
        for info, data in records.items():
            new.writestr(info, data)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"].update(describe_files(folder, [name]))
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_a_pickle_torch_cannot_parse_is_invalid_and_passed_over_by_checkpoints_export_and_resume(finished_run_copy):
    run = finished_run_copy(*TWO_CHECKPOINTS)
    older, newer = sorted((run.path / "checkpoints").glob("step_*"))
    replace_pickle(newer, "model.pt", pickle.dumps({"w": "x"}, protocol=0))  # 'V', '(': opcodes torch never writes

    listing = cli("checkpoints", str(run.path), timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert f"INVALID: model.pt: cannot be read as a torch checkpoint (UnpicklingError: Unsupported operand" in \
        listing.stdout and listing.stdout.count("INVALID") == 1, listing.stdout

    exported = cli("export", str(run.path), timeout=300)
    assert exported.returncode == 0, exported.stderr
    assert json.loads((run.path / "model" / "trainbook-model.json").read_text())["step"] == 5, "the earlier step"

    run.write_status(state="failed")
    resumed = cli("resume", str(run.path), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    (invalid,) = run.events("checkpoint_invalid")
    assert invalid["checkpoint"] == newer.name and "Unsupported operand" in invalid["reason"], invalid
    starts = [e for e in run.events("status") if e.get("resumed_from")]
    assert starts[-1]["resumed_from"] == older.name and run.read_status()["step"] == 10


@pytest.mark.slow
def test_deepspeed_files_are_loaded_without_running_code(train_tiny, tmp_path):
    from toolkit.deploy.export import WEIGHT_READERS

    proc, run = train_tiny("--engine", "deepspeed", "--set", "engine.zero_stage=2", *ONE_CHECKPOINT)
    assert proc.returncode == 0, proc.stderr
    (folder,) = (run.path / "checkpoints").glob("step_*")
    marker = tmp_path / "code-ran"
    (optim,) = [p.relative_to(folder).as_posix() for p in folder.glob("ds/*optim_states.pt")]
    plant(folder, optim, marker)

    assert "INVALID" in cli("checkpoints", str(run.path)).stdout
    manifest = json.loads((folder / MANIFEST).read_text())
    with pytest.raises(Exception, match="Weights only load failed"):  # DeepSpeed's own reader, forced safe
        WEIGHT_READERS["deepspeed"](folder, manifest)
    loaded = load_into_engine(run, folder)
    assert loaded.returncode == 3 and "posix.system" in loaded.stdout, loaded.stdout + loaded.stderr[-2000:]
    assert not marker.exists(), "a planted pickle ran"


@pytest.fixture
def bystander():
    """An unrelated program in a process group of its own: what a recycled pid in status.json points at."""
    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


def test_kill_refuses_a_finished_run_and_a_group_that_is_not_the_runs(finished_run_copy, bystander):
    run = finished_run_copy(*ONE_CHECKPOINT)
    run.write_status(worker_pgid=bystander.pid)  # the finished run's group id, now some other program's

    refused = cli("kill", str(run.path))
    assert refused.returncode == 2 and "has completed; nothing was signalled" in refused.stderr, refused.stderr

    run.write_status(state="running")  # a stale or copied status.json that still says running
    refused = cli("kill", str(run.path))
    assert refused.returncode == 2 and f"process group {bystander.pid} in status.json is not this run's" \
        in refused.stderr, refused.stderr
    assert bystander.poll() is None, "kill signalled a process that is not the run's"


def test_resume_is_not_blocked_by_a_recycled_supervisor_pid(finished_run_copy, bystander):
    run = finished_run_copy(*ONE_CHECKPOINT)
    run.write_status(state="running", supervisor_pid=bystander.pid)  # a crash left "running" behind
    resumed = cli("resume", str(run.path))
    assert resumed.returncode == 0, resumed.stderr
    assert bystander.poll() is None


def test_resume_refuses_when_a_live_supervisor_of_the_run_cannot_be_ruled_out(finished_run_copy):
    """A run started before run tokens existed (or whose supervisor's environment cannot be read) has no token to
    compare: resume then fails closed while a process whose command line is that run's supervisor is alive."""
    run = finished_run_copy(*ONE_CHECKPOINT)
    supervisor = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "toolkit.runs.supervisor",
                                   str(run.path)], stdin=subprocess.PIPE)
    try:
        status = {**run.read_status(), "state": "running", "supervisor_pid": supervisor.pid}
        del status["run_token"]  # as an older Trainbook wrote it
        run.status_path.write_text(json.dumps(status))
        refused = cli("resume", str(run.path))
        assert refused.returncode == 2 and "is still running" in refused.stderr, refused.stderr
    finally:
        supervisor.kill()
        supervisor.wait()


def test_a_handle_kill_that_comes_after_the_runs_end_is_a_no_op(tmp_path):
    """What notebook 04 does when the run finishes between its step-K event and the kill: False, not an error
    (the command line, asked to kill a finished run, refuses it: see above)."""
    from toolkit import config as config_mod
    from toolkit.runs import launch

    handle = launch.start(config_mod.load("tiny", ["train.max_steps=3"]), run_dir=tmp_path / "run")
    assert handle.wait() == 0
    assert handle.kill() is False
