"""Which live processes belong to a run: the check before any signal is sent to a pid read from status.json.

status.json records the supervisor's pid and the training process group, but a pid outlives nothing: once a run
has ended the number may belong to any program (or status.json may come from a copied run directory). Every
process a run starts carries the run's token in its environment (``TRAINBOOK_RUN_TOKEN``, inherited by the
launcher and every rank), so before signalling we look for that token in the processes themselves.
"""

from __future__ import annotations

import os
import secrets

TOKEN_ENV = "TRAINBOOK_RUN_TOKEN"
SUPERVISOR_MODULE = "toolkit.runs.supervisor"  # run with -m by the launcher; recognised here by its command line


def new_token() -> str:
    return secrets.token_hex(16)


def carries_token(pid: int, token: str | None) -> bool:
    """True if process ``pid`` is alive and was started with this run's token."""
    import psutil

    if not token or not pid:
        return False
    try:
        return psutil.Process(int(pid)).environ().get(TOKEN_ENV) == token
    except (psutil.Error, OSError, ValueError):  # gone, a zombie, or another user's: not ours to signal
        return False


def may_be_runs(pid, token: str | None, run_dir) -> bool:
    """For refusing to start a second supervisor: True unless ``pid`` is provably not this run's supervisor. It is
    not if it is dead, carries another token, or (when its environment cannot be read, or the run predates
    tokens) its command line is readable and is not ``toolkit.runs.supervisor RUN_DIR``."""
    import psutil

    try:
        process = psutil.Process(int(pid))
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
    except (psutil.NoSuchProcess, ValueError, TypeError):
        return False
    except psutil.Error:
        return True
    try:
        found = process.environ().get(TOKEN_ENV)
        if token and found is not None:
            return found == token
    except psutil.Error:
        pass
    try:
        command = process.cmdline()
    except psutil.Error:
        return True  # cannot tell: assume it is (starting a second supervisor would corrupt the run)
    return SUPERVISOR_MODULE in command and any(os.path.abspath(arg) == os.path.abspath(run_dir) for arg in command)


def group_members(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    import psutil

    members = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                members.append(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def group_is_runs(pgid: int, token: str | None) -> bool:
    """True if process group ``pgid`` is alive and at least one of its processes carries the run's token."""
    return bool(pgid) and any(carries_token(pid, token) for pid in group_members(int(pgid)))


def wait_for_exit(pid: int, timeout: float | None = None) -> bool:
    """Wait until process ``pid`` (a child of another process: its exit code is not ours) has exited; True if it
    has, False if ``timeout`` seconds passed first. A pidfd becomes readable when the process exits, before its
    parent reaps it, so a zombie counts as exited (psutil's wait for a non-child would wait for the reaping, which a
    parent that never polls never does)."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)
