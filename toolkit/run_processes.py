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
