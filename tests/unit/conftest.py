"""The unit tier is pure logic and runs in seconds: a test here that starts a process (a subprocess, a fork, an exec)
fails, naming what it started. Such a test belongs in tests/e2e (docs/CONTRIBUTING.md, "Which tier a test goes in").

The guard is a Python audit hook (PEP 578), which the standard library calls before it starts any process; it is on
only while a test of this folder runs, so an end-to-end test that the same pytest-xdist worker runs next is not
touched."""

from __future__ import annotations

import sys

import pytest

PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp",
                            "os.system", "os.exec", "os.spawn", "pty.spawn"})


class StartedAProcess(RuntimeError):
    """A unit test started a process."""


_guard = {"on": False}


def _refuse_processes(event: str, args: tuple) -> None:
    if _guard["on"] and event in PROCESS_EVENTS:
        _guard["on"] = False  # once: pytest reports the failure without the guard in its way
        raise StartedAProcess(f"tests/unit is pure logic, and this test started a process ({event}: "
                              f"{str(args[:2])[:200]}); a test that starts processes belongs in tests/e2e")


sys.addaudithook(_refuse_processes)  # hooks cannot be removed: it stays, off outside this folder's tests


@pytest.fixture(autouse=True)
def no_process_started():
    _guard["on"] = True
    try:
        yield
    finally:
        _guard["on"] = False
