"""Start training as a subprocess in its own process group and talk to it through its run directory.

Training never runs inside the caller (a notebook kernel, the CLI, a test): a crash, a CUDA re-initialisation
or a DeepSpeed launcher cannot take the caller down, and one ``killpg`` stops every rank.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

from toolkit import config as config_mod
from toolkit.distributed import free_port
from toolkit import paths
from toolkit.rundir import FINAL_STATES, EventLog, RunDir

LOG_NAME = "train.log"  # stdout and stderr of every rank: the first place to look when a run dies early


def resolve_launcher(engine_cfg) -> str | None:
    if engine_cfg.nproc == 1:
        return None
    if engine_cfg.launcher != "auto":
        return engine_cfg.launcher
    return "deepspeed" if engine_cfg.name == "deepspeed" else "torchrun"


def _torchrun(cfg, run_dir, port):
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={cfg.engine.nproc}",
            "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "toolkit.worker", str(run_dir)]


def _deepspeed(cfg, run_dir, port):
    # The DeepSpeed launcher's own entry, run with this interpreter so the venv's packages are used.
    return [sys.executable, "-m", "deepspeed.launcher.runner", f"--num_gpus={cfg.engine.nproc}",
            f"--master_port={port}", "--no_local_rank", "--module", "toolkit.worker", str(run_dir)]


LAUNCHERS = {"torchrun": _torchrun, "deepspeed": _deepspeed}


def worker_command(cfg, run_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment that start every rank of this run."""
    env = {"PYTHONUNBUFFERED": "1"}
    launcher = resolve_launcher(cfg.engine)
    if launcher is None:
        return [sys.executable, "-m", "toolkit.worker", str(run_dir)], env
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


class RunHandle:
    """A running (or finished) training job: its run directory and its process group."""

    def __init__(self, run: RunDir, process: subprocess.Popen):
        self.run = run
        self.process = process
        self._kill_requested = False
        self._offset = 0

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

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal every process of the run (launcher and all ranks), e.g. SIGKILL to simulate a lost node."""
        self._kill_requested = True
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL if the run has not exited after grace_s."""
        self.kill(signal.SIGTERM)
        try:
            return self.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL)
            return self.wait()

    def new_events(self) -> list[dict]:
        events, self._offset = self.run.read_events(self._offset)
        return events

    def follow(self, interval_s: float = 0.5) -> Iterator[dict]:
        """Yield events as rank 0 writes them, until the run's process exits (then the rest, then stop)."""
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
        """If the run died without saying so (a signal, a launcher failure), record it in the run directory."""
        status = self.run.read_status()
        if status.get("state") in FINAL_STATES:
            return
        state = "killed" if self._kill_requested or code < 0 else ("completed" if code == 0 else "failed")
        detail = f"exit code {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"
        log = EventLog(self.run.events_path)
        log.emit("status", state=state, exit_code=code, reason=detail)
        log.close()
        self.run.write_status(state=state, exit_code=code, error=None if state == "completed" else detail)


def start(config: config_mod.Config, run_dir: str | Path | None = None, runs_root: str | Path | None = None
          ) -> RunHandle:
    """Create the run directory, write the resolved config, and start training in a new process group."""
    run = RunDir.create(run_dir or default_run_dir(config, runs_root), config)
    cmd, extra_env = worker_command(config, run.path)
    log = open(run.path / LOG_NAME, "ab")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               env={**os.environ, **extra_env}, start_new_session=True)
    log.close()  # the child holds its own descriptor
    run.write_status(launcher_pid=process.pid, command=cmd)
    return RunHandle(run, process)


def train(config_path: str | Path | None = None, overrides: list[str] | None = None, **kwargs) -> RunHandle:
    """Load and validate a config (errors surface here, before anything starts), then :func:`start` it."""
    return start(config_mod.load(config_path, overrides), **kwargs)
