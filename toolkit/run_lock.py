"""One run directory, one run: an exclusive lock on ``run.lock`` held for the run's whole life.

The launcher takes it before it writes anything (two `train` commands started at once into one ``--run-dir``:
the second is refused), and hands it to the supervisor, which passes it on to the training processes: the lock
is an open file shared by all of them, released by the kernel when the last one exits, however it exits
(SIGKILL included), so a crashed run never leaves a stale lock behind. The file holds the holder's pid, for the
message that refuses a second start.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path

from toolkit.errors import RefusedValue, UserError, not_allowed

LOCK_NAME = "run.lock"
HOLDER_WIDTH = 12  # bytes of the holder record: a right-aligned pid (Linux pids have at most 7 digits) and "\n"


class RunBusyError(UserError, RuntimeError):
    """The run directory already has a live run."""


def acquire(run_dir: str | Path) -> int:
    """Lock ``run_dir`` (created if need be) for this process; returns the lock's file descriptor. Raises
    RunBusyError, naming the holder's pid, when another run holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = open_lock_file(run_dir / LOCK_NAME)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, HOLDER_WIDTH, 0).decode(errors="replace").strip() or "not recorded yet"
            raise RunBusyError(
                not_allowed(
                    "run_dir",
                    run_dir,
                    "a run directory no live run holds (stop that run first, or choose another --run-dir)",
                    problem=f"is in use by another run (pid {holder})",
                )
            ) from None
        record_holder(fd, os.getpid())
    except BaseException:  # refused, or the record could not be written: never keep a lock nobody can release
        os.close(fd)
        raise
    return fd


def open_lock_file(path: Path) -> int:
    """Open (creating) a lock file of the run directory. O_NOFOLLOW: a run directory may be a copy from elsewhere,
    and a planted link must not make us create, lock or truncate a file outside it."""
    try:  # O_NONBLOCK: a planted FIFO would block the open; it is refused below instead
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RefusedValue(
                not_allowed(path.name, path, "a regular file of the run directory (or none)", problem="is a link")
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise RefusedValue(
            not_allowed(
                path.name, path, "a regular file of the run directory (or none)", problem="is not a regular file"
            )
        )
    return fd


def record_holder(fd: int, pid: int) -> None:
    """Name ``pid`` as the lock's holder (the launcher, then the supervisor it hands the lock to). One write of a
    fixed width: a process refused meanwhile reads the old pid or the new one, never an empty or mixed file."""
    record = f"{pid:>{HOLDER_WIDTH - 1}}\n".encode()
    os.pwrite(fd, record, 0)
    os.ftruncate(fd, len(record))
