"""Start training as a subprocess in its own process group and talk to it through its run directory.

Training never runs inside the caller (a notebook kernel, the CLI, a test): a crash, a CUDA re-initialisation
or a DeepSpeed launcher cannot take the caller down, and one ``killpg`` stops every rank.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from toolkit import config as config_mod
from toolkit import paths
from toolkit.runs import processes as run_processes
from toolkit.checkpoint.store import CheckpointStore
from toolkit.ports import free_port
from toolkit.runs.events import Event, StatusEvent, read_new
from toolkit.runs.rundir import FINAL_STATES, RunDir
from toolkit.runs.supervisor import LOG_NAME, describe_exit



def resolve_launcher(engine_cfg) -> str | None:
    if engine_cfg.nproc == 1:
        return None
    if engine_cfg.launcher != "auto":
        return engine_cfg.launcher
    return "deepspeed" if engine_cfg.name == "deepspeed" else "torchrun"


def _torchrun(cfg, run_dir, port):
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={cfg.engine.nproc}",
            "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "toolkit.runs.worker", str(run_dir)]


def _deepspeed(cfg, run_dir, port):
    # The DeepSpeed launcher's own entry, run with this interpreter so the venv's packages are used.
    return [sys.executable, "-m", "deepspeed.launcher.runner", f"--num_gpus={cfg.engine.nproc}",
            f"--master_port={port}", "--no_local_rank", "--module", "toolkit.runs.worker", str(run_dir)]


LAUNCHERS = {"torchrun": _torchrun, "deepspeed": _deepspeed}


def worker_command(cfg, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment that start every rank of this run."""
    env = {"PYTHONUNBUFFERED": "1"}
    launcher = resolve_launcher(cfg.engine)
    if launcher is None:
        return [sys.executable, "-m", "toolkit.runs.worker", str(run_dir)], env
    if launcher == "deepspeed":
        env["LOCAL_SIZE"] = str(cfg.engine.nproc)  # on CPU the launcher counts "accelerators" from this
    return LAUNCHERS[launcher](cfg, run_dir, free_port()), env


def default_run_dir(cfg, root: str | Path | None = None) -> Path:
    root = Path(root) if root else paths.runs_root()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = root / f"{cfg.name}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = root / f"{cfg.name}-{stamp}-{n}"
    return path


class RunBusyError(RuntimeError):
    """The run directory already has a live supervisor."""


class NotThisRunError(RuntimeError):
    """A signal refused: the run has finished, or the process status.json names is no longer the run's."""


class RunHandle:
    """A training job: its run directory, its supervisor process, and (through status.json) its ranks."""

    def __init__(self, run: RunDir, process: subprocess.Popen, from_offset: int = 0):
        self.run = run
        self.process = process  # the supervisor
        self._offset = from_offset

    @property
    def path(self) -> Path:
        return self.run.path

    def poll(self) -> int | None:
        code = self.process.poll()
        if code is not None:
            self._finalize(code)
        return code

    def wait(self, timeout: float | None = None) -> int:
        code = self.process.wait(timeout)
        self._finalize(code)
        return code

    def kill(self, sig: int = signal.SIGKILL) -> bool:
        """Simulate a hardware failure: signal every training process (all ranks and their launcher).

        The supervisor survives and, with --max-restarts, restarts from the latest valid checkpoint.
        Returns False when no training process was running, the run having ended first included (a notebook
        that kills at step K races the run's own end); still refuses a process group that is not the run's.
        """
        try:
            return kill_training(self.run, sig)
        except NotThisRunError:
            if self.run.read_status().get("state") in FINAL_STATES:
                return False
            raise

    def stop(self, grace_s: float = 15.0) -> int:
        """Stop the run for good: SIGTERM to the supervisor (which passes it to the ranks), then SIGKILL."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            return self.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(NotThisRunError):  # it ended meanwhile
                kill_training(self.run, signal.SIGKILL)
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.wait()

    def new_events(self) -> list[Event]:
        events, self._offset = read_new(self.run.events_path, self._offset)
        return events

    def follow(self, interval_s: float = 0.5) -> Iterator[Event]:
        """Yield events as they are written, until the supervisor exits (then the rest, then stop)."""
        while True:
            try:
                self.process.wait(interval_s)  # wakes as soon as the run ends; otherwise every interval
                finished = True
            except subprocess.TimeoutExpired:
                finished = False
            yield from self.new_events()
            if finished:
                self.wait()
                yield from self.new_events()
                return

    def _finalize(self, code: int) -> None:
        """If even the supervisor died without a final state (it was SIGKILLed), record that."""
        if self.run.read_status().get("state") in FINAL_STATES:
            return
        state = "completed" if code == 0 else "killed"
        reason = describe_exit(code)
        self.run.append_event(StatusEvent(state=state, exit_code=code, reason=reason))
        self.run.write_status(state=state, exit_code=code, error=None if code == 0 else reason)


def kill_training(run: str | Path | RunDir, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to a run's training process group (as recorded in status.json). Returns False when no
    training process is running; refuses (NotThisRunError) a finished run, or a group that is not the run's."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    status = run.read_status()
    if status.get("state") in FINAL_STATES:
        raise NotThisRunError(f"run_dir: {str(run.path)!r} has {status['state']}; nothing was signalled (allowed: "
                              "a run that is running)")
    pgid = status.get("worker_pgid")
    if not isinstance(pgid, int) or pgid <= 1 or not run_processes.group_members(pgid):
        return False
    if not run_processes.group_is_runs(pgid, status.get("run_token")):
        raise NotThisRunError(f"run_dir: process group {pgid} in status.json is not this run's training (none of "
                              "its processes carries the run's token: the run ended and the id was reused, or the "
                              "run directory was copied); nothing was signalled")
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False


def _start_supervisor(run: RunDir, max_restarts: int, from_offset: int = 0) -> RunHandle:
    token = run_processes.new_token()  # inherited by the supervisor, the launcher and every rank
    run.write_status(run_token=token)
    with open(run.path / LOG_NAME, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "toolkit.runs.supervisor", str(run.path), "--max-restarts", str(max_restarts)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, run_processes.TOKEN_ENV: token})
    run.write_status(supervisor_pid=process.pid, max_restarts=max_restarts)
    return RunHandle(run, process, from_offset)


def pin_data_asset(config: config_mod.Config) -> config_mod.Config:
    """Resolve data.asset ('name' means latest) to the exact name:version and workspace, so the run, its
    restarts and its lineage all use one immutable snapshot even if a new version is registered meanwhile.
    A data.path is checked to exist and to suit the model; it is read in place."""
    if not config.data.asset and not config.data.path:
        return config
    import dataclasses

    from toolkit.catalogue import data_assets
    from toolkit.train.models import MODELS
    from toolkit.catalogue.workspace import Workspace

    if config.data.path:
        asset, field = data_assets.open_path(config.data.path, hash=False), "data.path"
    else:
        ws = Workspace.open(config.data.workspace or None)
        asset, field = data_assets.get(ws, config.data.asset), "data.asset"
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, asset=asset.ref,
                                                                      workspace=str(ws.root)))
    allowed = MODELS[config.model.name].asset_types
    if asset.type not in allowed:
        shown = config.data.path if config.data.path else asset.ref
        raise data_assets.DataAssetError(
            f"{field}: {shown} is a {asset.type} asset; allowed for model.name={config.model.name!r}: "
            + ", ".join(allowed))
    return config


def start(config: config_mod.Config, run_dir: str | Path | None = None, runs_root: str | Path | None = None,
          max_restarts: int = 0) -> RunHandle:
    """Create the run directory, write the resolved config, and start training under a supervisor."""
    if max_restarts < 0:
        raise ValueError(f"max_restarts: {max_restarts} is negative; allowed: 0 or more")
    config = pin_data_asset(config)
    run = RunDir.create(run_dir or default_run_dir(config, runs_root), config)
    index_run(run, config)
    return _start_supervisor(run, max_restarts)


def index_run(run: RunDir, config: config_mod.Config) -> None:
    """Record the run in its workspace's catalogue, so `trainbook runs` can say what was trained on what."""
    from toolkit.catalogue.workspace import Workspace

    with Workspace.open(config.data.workspace or None).transaction() as conn:
        conn.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)",
                     (str(run.path.resolve()), config.name, time.time(), config.fingerprint(),
                      config.data.asset or (f"path:{config.data.path}" if config.data.path else f"builtin:{config.data.dataset}"), config.engine.name, config.engine.nproc))


def list_runs(workspace=None, data: str | None = None) -> list[dict]:
    """Indexed runs, newest first, with their live state from status.json; ``data`` filters by asset name."""
    from toolkit.catalogue.workspace import Workspace

    conn = Workspace.open(workspace).connect()
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY created DESC")]
    finally:
        conn.close()
    if data is not None:
        rows = [r for r in rows if r["data"] == data or r["data"].split(":")[0] == data]
    for row in rows:
        status = RunDir(row["run_dir"]).read_status()
        row["state"], row["step"] = status.get("state", "missing"), status.get("step")
    return rows


def train(config_path: str | Path | None = None, overrides: list[str] | None = None, **kwargs) -> RunHandle:
    """Load and validate a config (errors surface here, before anything starts), then :func:`start` it."""
    return start(config_mod.load(config_path, overrides), **kwargs)


def resume(run_dir: str | Path, max_restarts: int = 0, from_checkpoint: str | None = None) -> RunHandle:
    """Continue a stopped, killed or failed run from its latest valid checkpoint (same run directory), or roll
    it back to ``from_checkpoint`` (a name such as ``step_00000040``; newer checkpoints are set aside, kept)."""
    run = RunDir(run_dir)
    if not run.config_path.is_file():
        raise FileNotFoundError(f"run_dir: {str(run_dir)!r} holds no run (no config.yaml); allowed: a run directory")
    run.read_config()  # a config the run could not start with is refused here, before anything changes
    status = run.read_status()
    if status.get("state") in ("queued", "running") and \
            run_processes.may_be_runs(status.get("supervisor_pid"), status.get("run_token"), run.path):
        raise RunBusyError(f"run_dir: {str(run_dir)!r} is still running (supervisor pid "
                           f"{status['supervisor_pid']}); stop it first")
    if from_checkpoint is not None:
        CheckpointStore(run.path).roll_back_to(from_checkpoint)
    offset = run.events_path.stat().st_size if run.events_path.exists() else 0
    run.write_status(state="queued", resumed=time.time())
    return _start_supervisor(run, max_restarts, from_offset=offset)

