"""Start training as a subprocess in its own process group and talk to it through its run directory.

Training never runs inside the caller (a notebook kernel, the CLI, a test): a crash, a CUDA re-initialisation
or a DeepSpeed launcher cannot take the caller down, and one ``killpg`` stops every rank.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from collections.abc import Iterator

from toolkit import config as config_mod
from toolkit import paths
from toolkit.errors import MissingPath, RefusedValue, not_allowed
from toolkit.fsio import open_log
from toolkit.runs import processes as run_processes
from toolkit import run_lock
from toolkit import trust
from toolkit import status as run_status
from toolkit.checkpoint.store import RESUMABLE_CHANGES, CheckpointStore, check_compatible
from toolkit.rundir import RunDir
from toolkit.runs.data_pin import pin_data_asset
from toolkit.train.engines import check_engine
from toolkit.train.models.preflight import check_model, pin_model
from toolkit.runs.handle import RunHandle
from toolkit.runs.run_index import index_run
from toolkit.run_lock import RunBusyError
from toolkit.runs.supervisor import LOG_NAME


def default_run_dir(cfg, root: str | Path | None = None) -> Path:
    """A new, empty run directory named after the config and the time, created here: the name is taken when it is
    chosen (mkdir fails if it exists), so two starts in the same second, in one process or two, never pick the
    same one (the second would be refused by the first one's run lock); a suffix -2, -3... tells them apart."""
    root = Path(root) if root else paths.runs_root()
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        path = root / (f"{cfg.name}-{stamp}" if n == 1 else f"{cfg.name}-{stamp}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path


class NothingToResume(RuntimeError):
    """`resume` of a run that has completed: nothing was started and nothing changed; the message says what to
    do instead."""


def _start_supervisor(run: RunDir, lock_fd: int, max_restarts: int, from_offset: int = 0, plan: str = "") -> RunHandle:
    """Start the supervisor and hand it the run lock (``lock_fd``, closed here: from now on the supervisor and
    the training processes hold it)."""
    token = run_processes.new_token()  # inherited by the supervisor, the launcher and every rank
    run_status.update(run, run_token=token)
    with open_log(run.path / LOG_NAME) as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                run_processes.SUPERVISOR_MODULE,
                str(run.path),
                "--max-restarts",
                str(max_restarts),
                "--lock-fd",
                str(lock_fd),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **paths.SAFE_PATH_ENV, run_processes.TOKEN_ENV: token},
            pass_fds=(lock_fd,),
        )
    run_lock.record_holder(lock_fd, process.pid)
    run_status.update(run, supervisor_pid=process.pid, max_restarts=max_restarts)
    return RunHandle(run, process, from_offset, plan)


# Set once a start or resume begins to write the run and start its supervisor, and left set when it has (cleared
# again only if it failed, having started nothing). Before it, nothing exists that a stop would have to stop (the
# checks, the data's tokenization): a stop signal may end the command there and then. From it on, the command holds
# the signal until the run's handle exists and then stops the run (toolkit.cli.following, which clears it first).
COMMITTING = threading.Event()


@contextlib.contextmanager
def committing() -> Iterator[None]:
    COMMITTING.set()
    try:
        yield
    except BaseException:
        COMMITTING.clear()
        raise


@contextlib.contextmanager
def _holding_run_lock(run_dir: Path) -> Iterator[int]:
    """The run lock for the time it takes to start the run; closed on the way out (the supervisor keeps its own
    copy, so the run stays locked; when nothing was started, the directory is free again)."""
    fd = run_lock.acquire(run_dir)
    try:
        yield fd
    finally:
        os.close(fd)


def start(
    config: config_mod.Config,
    run_dir: str | Path | None = None,
    runs_root: str | Path | None = None,
    max_restarts: int = 0,
) -> RunHandle:
    """Create the run directory, write the resolved config, and start training under a supervisor."""
    if max_restarts < 0:
        raise RefusedValue(not_allowed("max_restarts", max_restarts, "0 or more", problem="is negative"))
    config = pin_data_asset(config)
    config = pin_model(config)
    check_model(config)  # the user's model, pretrained weights, LoRA: refused here, before any folder is made
    check_engine(config, world=config.engine.nproc)  # fp16 and a DeepSpeed file, for this machine's devices
    run_dir = Path(run_dir or default_run_dir(config, runs_root))
    with committing(), _holding_run_lock(run_dir) as lock_fd:  # before anything is written: a second start is refused
        run = RunDir.create(run_dir, config)
        index_run(run, config)
        return _start_supervisor(run, lock_fd, max_restarts)


def train(config_path: str | Path | None = None, overrides: list[str] | None = None, **kwargs) -> RunHandle:
    """Load and validate a config (errors surface here, before anything starts), then :func:`start` it."""
    return start(config_mod.load(config_path, overrides), **kwargs)


def resume(
    run_dir: str | Path,
    max_restarts: int = 0,
    from_checkpoint: str | None = None,
    trust_run: bool = False,
    changes: list[str] | None = None,
) -> RunHandle:
    """Continue a stopped, killed or failed run from its latest valid checkpoint (same run directory), or roll
    it back to ``from_checkpoint`` (a name such as ``step_00000040``; newer checkpoints are set aside, kept).
    The handle's ``plan`` says which checkpoint it starts from. A completed run raises NothingToResume (nothing
    is started, nothing changes) unless rolled back. A config that runs code, reaches the network or opens a port
    is honoured only for the user's own run, or with ``trust_run`` (toolkit.trust). ``changes`` (``section.field=
    value`` strings) change fields that may differ between attempts (checkpoint.RESUMABLE_CHANGES), checked against
    the checkpoint it will start from before config.yaml is rewritten."""
    run = RunDir(run_dir)
    if not run.config_path.is_file():
        raise MissingPath(not_allowed("run_dir", run_dir, "a run directory", problem="holds no run (no config.yaml)"))
    cfg = run.read_config()  # a config the run could not start with is refused here, before anything changes
    trust.require(run.path, cfg, "resume", trust_run)  # so is one from elsewhere that would act beyond the run
    with committing(), _holding_run_lock(run.path) as lock_fd:
        status = run.read_status()
        if status.get("state") in ("queued", "running") and run_processes.may_be_runs(
            status.get("supervisor_pid"), status.get("run_token"), run.path
        ):
            raise RunBusyError(
                f"run_dir: {str(run_dir)!r} is still running (supervisor pid {status['supervisor_pid']}); stop it first"
            )
        store = CheckpointStore(run.path)
        changed = _changed_config(cfg, changes) if changes else None
        if changed is not None:
            check_engine(changed, world=changed.engine.nproc)
        longer = changed is not None and changed.train.max_steps > status.get("step", 0)
        if status.get("state") == "completed" and from_checkpoint is None and not longer:
            raise NothingToResume(_completed_hint(run, status, store))
        if from_checkpoint is not None:
            store.roll_back_to(from_checkpoint)
        info, skipped = store.find_resume_point()  # the trainer's own choice, made the same way
        if changed is not None:
            if info is not None:  # refused now, with config.yaml as it was, rather than by the trainer
                check_compatible(
                    info.manifest,
                    changed.to_dict(),
                    changed.engine.nproc,
                    changed.engine.tensor_parallel * changed.engine.pipeline_parallel,
                )
            run.write_config(changed)
        plan = f"resuming from {info.name}" if info else "no checkpoint: starting from step 0"
        if skipped:
            plan += f" (not usable: {', '.join(s.name for s in skipped)})"
        offset = run.events_path.stat().st_size if run.events_path.exists() else 0
        if from_checkpoint is not None:
            transition = "roll_back"
        else:
            transition = "extend" if status.get("state") == "completed" else "resume"
        run_status.transition(run, transition, resumed=time.time())
        return _start_supervisor(run, lock_fd, max_restarts, from_offset=offset, plan=plan)


def _changed_config(cfg: config_mod.Config, changes: list[str]) -> config_mod.Config:
    """The run's config with ``changes`` applied, each a field a resume may change."""
    for text in changes:
        key = text.split("=", 1)[0].strip()
        if not key.startswith(RESUMABLE_CHANGES):
            raise config_mod.ConfigError(
                not_allowed(
                    "--set",
                    text,
                    "a field that may change between attempts: " + ", ".join(RESUMABLE_CHANGES),
                    problem="changes what a step computes, so the checkpoint would not fit it",
                )
            )
    return config_mod.from_dict(config_mod.apply_overrides(cfg.to_dict(), changes))


def _completed_hint(run: RunDir, status: dict, store: CheckpointStore) -> str:
    import shlex

    checkpoints = [p.name for p in store.published()]
    again = (
        f"; to train it again from a checkpoint: trainbook resume {shlex.quote(str(run.path))} --from "
        f"CHECKPOINT (here: {', '.join(checkpoints)})"
        if checkpoints
        else ""
    )
    more = f"; to train it further: trainbook resume {shlex.quote(str(run.path))} --set train.max_steps=N"
    return f"{run.path} has completed at step {status.get('step')}: nothing to resume, nothing changed{again}{more}"
