"""Servers that belong to the process that started them: stop when it dies.

The local endpoint and TensorBoard run in their own session (Ctrl-C in a kernel must not reach them), so a
kernel that is killed or crashes without calling ``stop()`` would leave them running, holding a port and
memory; in a workshop every kernel restart would leak one. The starter puts its pid in ``PARENT_ENV``; the
server calls :func:`stop_with_parent` first thing.
"""

from __future__ import annotations

import os
import select
import signal
import threading

PARENT_ENV = "TRAINBOOK_PARENT_PID"


def parent_env() -> dict[str, str]:
    """What a starter adds to the server's environment: this process is the one to outlive."""
    return {PARENT_ENV: str(os.getpid())}


def stop_with_parent() -> None:
    """If ``PARENT_ENV`` names a process, SIGTERM this process group when it exits (a server leads its own)."""
    when_parent_exits(lambda: os.killpg(os.getpgrp(), signal.SIGTERM))


def when_parent_exits(action) -> None:
    """If ``PARENT_ENV`` names a process, call ``action`` when it exits (at once if it is gone). Waits on a pidfd
    (readable when the process ends: an event, not polling) in a daemon thread, which forked workers do not
    inherit, and which runs even while the main thread spins in Python code."""
    if not os.environ.get(PARENT_ENV):
        return
    try:
        pidfd = os.pidfd_open(int(os.environ[PARENT_ENV]))
    except ProcessLookupError:  # gone already
        action()
        return
    except (AttributeError, OSError, ValueError):  # no pidfd on this platform: the process lives until stopped
        return

    def watch() -> None:
        select.select([pidfd], [], [])
        action()

    threading.Thread(target=watch, daemon=True, name="trainbook-parent-watch").start()
