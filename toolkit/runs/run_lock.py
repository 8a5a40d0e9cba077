"""One run directory, one run: an exclusive lock on ``run.lock`` held for the run's whole life.

The launcher takes it before it writes anything (two `train` commands started at once into one ``--run-dir``:
the second is refused), and hands it to the supervisor, which passes it on to the training processes: the lock
is an open file shared by all of them, released by the kernel when the last one exits, however it exits
(SIGKILL included), so a crashed run never leaves a stale lock behind. The file holds the holder's pid, for the
message that refuses a second start.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = "run.lock"


class RunBusyError(RuntimeError):
    """The run directory already has a live run."""


def acquire(run_dir: str | Path) -> int:
    """Lock ``run_dir`` (created if need be) for this process; returns the lock's file descriptor. Raises
    RunBusyError, naming the holder's pid, when another run holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW: a run directory may be a copy from elsewhere; a planted link must not lock (and truncate) a
    # file outside it.
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "not recorded yet"
        os.close(fd)
        raise RunBusyError(f"run_dir: {str(run_dir)!r} is in use by another run (pid {holder}); allowed: a run "
                           "directory no live run holds (stop that run first, or choose another --run-dir)") from None
    except BaseException:
        os.close(fd)
        raise
    record_holder(fd, os.getpid())
    return fd


def record_holder(fd: int, pid: int) -> None:
    """Name ``pid`` as the lock's holder (the launcher, then the supervisor it hands the lock to)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{pid}\n".encode(), 0)
