"""The run's states and the one way to change them: every writer of status.json goes through :func:`transition`
(a change of state) or :func:`update` (facts such as the step or the pids, with no change of state).

Writers live in three processes (the launcher, the supervisor, rank 0 of the training processes), so each change
is a read-check-write made under an exclusive lock on ``status.lock`` in the run directory: a writer never
overwrites a state another process recorded meanwhile, and a change the table below does not allow is refused
with :class:`IllegalTransition` (the file is left as it was).

    create   (new)                               -> queued     the launcher wrote config.yaml
    start    queued, running                     -> running    rank 0 reports training (again, on a restart)
    restart  queued, running, failed             -> running    the supervisor starts the next attempt
    complete running                             -> completed  rank 0 finished and published its last checkpoint
    fail     queued, running, completed          -> failed     an error (after completed: the processes then died)
    stop     queued, running, completed          -> stopped    stopped on request (Ctrl-C or SIGTERM/SIGHUP to
                                                               `trainbook train`, handle.stop(), the stop button)
    kill     queued, running, completed          -> killed     a death nobody asked for (a lost node, a SIGKILLed
                                                               worker or supervisor, `trainbook kill`)
    resume   queued, running, failed, stopped,   -> queued     `resume` (queued/running: left by a dead supervisor;
             killed                                            a new run: a copy without its status.json)
    roll_back  any state                         -> queued     `resume --from CHECKPOINT`, a completed run included
    extend   completed                           -> queued     `resume --set train.max_steps=N`: more steps
    retry    any state                           -> queued     an external launcher (Azure ML) re-runs the job

A completed run is not resumed (nothing is left to train; its final figures stay): only rolled back, or extended.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

from toolkit.errors import not_allowed, refused

STATES = ("queued", "running", "completed", "failed", "stopped", "killed")
FINAL_STATES = ("completed", "failed", "stopped", "killed")
# what a person resumes; queued/running only when left by a dead supervisor
RESUMABLE_STATES = ("failed", "stopped", "killed")

LOCK_NAME = "status.lock"

# set by the supervisor in the training processes it starts: their attempt, 0 first, +1 per restart or resume
ATTEMPT_ENV = "TRAINBOOK_ATTEMPT"
# set ("1") by an elastic job (toolkit.runs.job --nnodes MIN:MAX) in its training processes: torchrun's agent stops
# them with SIGTERM when the nodes change, and starts them again at the new world size; that is no stop of the run
ELASTIC_ENV = "TRAINBOOK_ELASTIC"

# transition -> (the states it may leave, the state it enters); None is a run directory without a status yet
TRANSITIONS: dict[str, tuple[tuple[str | None, ...], str]] = {
    "create": ((None,), "queued"),
    "start": (("queued", "running"), "running"),
    "restart": (("queued", "running", "failed"), "running"),
    "complete": (("running",), "completed"),
    "fail": (("queued", "running", "completed"), "failed"),
    "stop": (("queued", "running", "completed"), "stopped"),
    "kill": (("queued", "running", "completed"), "killed"),
    "resume": ((None, "queued", "running", "failed", "stopped", "killed"), "queued"),
    "roll_back": ((None, *STATES), "queued"),
    "extend": (("completed",), "queued"),
    "retry": ((None, *STATES), "queued"),
}


class IllegalTransition(ValueError):
    """A change of state the table does not allow; status.json is left as it was."""


def next_state(current: str | None, name: str) -> str:
    """The state ``name`` leads to from ``current``, or IllegalTransition saying what is allowed."""
    if name not in TRANSITIONS:
        raise IllegalTransition(not_allowed("status transition", name, ", ".join(TRANSITIONS), problem="is unknown"))
    sources, target = TRANSITIONS[name]
    if current not in sources:
        shown = "a new run" if current is None else f"state {current!r}"
        allowed = ", ".join("a new run" if s is None else s for s in sources)
        raise IllegalTransition(refused(f"status transition {name!r}", f"not allowed from {shown}", f"from {allowed}"))
    return target


def transition(run, name: str, **fields) -> dict:
    """Move ``run`` (a RunDir) through transition ``name``, merging ``fields`` into status.json; returns the status.
    ``restart`` also counts the restart (under the lock, so two writers never count one)."""
    if "state" in fields:
        raise IllegalTransition(f"status field 'state': set by the transition ({name!r}), not passed in")
    with _locked(run):
        current = run.read_status()
        state = next_state(current.get("state"), name)
        if name == "restart":
            fields["restarts"] = int(current.get("restarts", 0)) + 1
        if name == "create":
            fields = {"step": 0, "restarts": 0, "created": time.time(), **fields}
        return run.write_status(state=state, **fields)


def update(run, **fields) -> dict:
    """Merge facts (step, pids, attempt...) into status.json without changing the state."""
    if "state" in fields:
        raise IllegalTransition(
            refused("status field 'state'", "changed only through transition()", "other fields here")
        )
    with _locked(run):
        return run.write_status(**fields)


def forbid_restart(run, attempt: int, reason: str) -> dict:
    """Rank 0 says attempt ``attempt`` failed in a way a restart would repeat (resumed exactly from the checkpoint
    before it, the same step goes wrong again): the supervisor ends the run instead of restarting it."""
    return update(run, no_restart={"attempt": attempt, "reason": reason})


def restart_forbidden(status: dict, attempt: int) -> str | None:
    """Why attempt ``attempt`` must not be restarted, or None. An earlier attempt's word (before a `resume`, which
    may have changed the watchdog's settings) does not count."""
    record = status.get("no_restart")
    if isinstance(record, dict) and record.get("attempt") == attempt:
        return str(record.get("reason") or "a restart would repeat the failure")
    return None


@contextlib.contextmanager
def _locked(run):
    """Hold ``status.lock`` for one read-check-write (milliseconds)."""
    from toolkit.run_lock import open_lock_file

    fd = open_lock_file(run.path / LOCK_NAME)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
