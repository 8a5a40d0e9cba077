"""A started run, seen from the process that started it: follow its events, wait for it, stop it, or kill its
training processes (a lost node). Everything goes through the run directory and the supervisor's process group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from collections.abc import Iterator

from toolkit.errors import MissingPath, UserError, not_allowed
from toolkit.runs import processes as run_processes
from toolkit import status as run_status
from toolkit.events import Event, StatusEvent, read_new
from toolkit.rundir import RunDir
from toolkit.status import FINAL_STATES
from toolkit.runs.supervisor import STOP_GRACE_S, describe_exit

# How long stop() waits for the run to save its checkpoint and end before it kills what is left: the supervisor's
# own grace, then 10 s more for the signal it passes on to the ranks.
STOP_WAIT_S = STOP_GRACE_S + 10.0


class NotThisRunError(UserError, RuntimeError):
    """A signal refused: the run has finished, or the process status.json names is no longer the run's."""


class RunHandle:
    """A training job: its run directory, its supervisor process, and (through status.json) its ranks."""

    def __init__(self, run: RunDir, process: subprocess.Popen, from_offset: int = 0, plan: str = ""):
        self.run = run
        self.process = process  # the supervisor
        self._offset = from_offset
        self.plan = plan  # what a resume starts from, in words ("resuming from step_00000040"); "" for a new run
        self.stop_requested = False  # stop() was called: a supervisor that then dies unrecorded was stopped

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

    def stop(self, grace_s: float = STOP_WAIT_S) -> int:
        """Stop the run for good: SIGTERM to the supervisor, which asks the ranks to save a checkpoint at the step
        they are in and end (toolkit.runs.supervisor); SIGKILL to whatever is left after ``grace_s``. The run ends
        "stopped" (resumable), even when the supervisor had to be SIGKILLed."""
        self.stop_requested = True
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
        for batch in self.follow_batches(interval_s):
            yield from batch

    def follow_batches(self, interval_s: float = 0.5) -> Iterator[list[Event]]:
        """``follow``, a read at a time: the events written since the last read, together (possibly none). A
        display redraws once per batch, so a slow display catches up with a fast run instead of lagging behind."""
        while True:
            try:
                self.process.wait(interval_s)  # wakes as soon as the run ends; otherwise every interval
                finished = True
            except subprocess.TimeoutExpired:
                finished = False
            yield self.new_events()
            if finished:
                self.wait()
                yield self.new_events()
                return

    def _finalize(self, code: int) -> None:
        """If even the supervisor died without a final state (it was SIGKILLed), record that: stopped when this
        handle asked for the stop, killed otherwise."""
        if self.run.read_status().get("state") in FINAL_STATES:
            return
        if code == 0:
            name, state, reason = "complete", "completed", None
        else:
            name, state = ("stop", "stopped") if self.stop_requested else ("kill", "killed")
            reason = describe_exit(code)
        try:  # the check above is not under the status lock: another process may record the end first
            run_status.transition(self.run, name, exit_code=code, error=reason)
        except run_status.IllegalTransition:
            return
        self.run.append_event(StatusEvent(state=state, exit_code=code, reason=reason or describe_exit(code)))


class _AttachedSupervisor:
    """The supervisor of a run this process did not start, with the part of ``subprocess.Popen`` RunHandle uses.
    Its exit code is not ours to read (only its parent can), so it is told from the run's record once it has
    ended: 0 completed or stopped on request, 1 another end, and SIGKILL when nothing was recorded (the supervisor
    records every other way it ends: it catches SIGTERM and SIGINT)."""

    def __init__(self, pid: int, run: RunDir):
        self.pid, self.run = pid, run

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        if not run_processes.wait_for_exit(self.pid, timeout):
            raise subprocess.TimeoutExpired(f"supervisor {self.pid}", timeout)
        state = self.run.read_status().get("state")
        return 0 if state in ("completed", "stopped") else 1 if state in FINAL_STATES else -signal.SIGKILL


def attach(run: str | Path | RunDir) -> RunHandle:
    """A handle on a running run started elsewhere (another terminal, a notebook): follow it from its first event,
    wait for it, stop it. Refuses a run that has ended, or whose supervisor is gone or is not the run's."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    if not run.path.is_dir():
        raise MissingPath(not_allowed("run_dir", run.path, "a run directory", problem="is not a folder"))
    status = run.read_status()
    if status.get("state") in FINAL_STATES:
        raise NotThisRunError(
            not_allowed(
                "run_dir",
                run.path,
                "a run that is running",
                problem=f"has {status['state']} at step {status.get('step')}",
            )
        )
    pid = status.get("supervisor_pid")
    if not run_processes.carries_token(pid, status.get("run_token")):
        raise NotThisRunError(
            f"run_dir: {run.path} says it is {status.get('state', 'unknown')}, but no supervisor "
            "of it is alive (the machine restarted, or it was killed, or the folder was copied); "
            f"`trainbook resume {run.path}` continues it from its latest checkpoint"
        )
    return RunHandle(run, _AttachedSupervisor(int(pid), run))


def kill_training(run: str | Path | RunDir, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to a run's training process group (as recorded in status.json). Returns False when no
    training process is running; refuses (NotThisRunError) a finished run, or a group that is not the run's."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    status = run.read_status()
    if status.get("state") in FINAL_STATES:
        raise NotThisRunError(
            not_allowed(
                "run_dir", run.path, "a run that is running", problem=f"has {status['state']}; nothing was signalled"
            )
        )
    pgid = status.get("worker_pgid")
    if not isinstance(pgid, int) or pgid <= 1 or not run_processes.group_members(pgid):
        return False
    if not run_processes.group_is_runs(pgid, status.get("run_token")):
        raise NotThisRunError(
            f"run_dir: process group {pgid} in status.json is not this run's training (none of "
            "its processes carries the run's token: the run ended and the id was reused, or the "
            "run directory was copied); nothing was signalled"
        )
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
