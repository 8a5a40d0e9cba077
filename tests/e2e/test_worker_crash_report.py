"""A training rank that dies in native code (a segfault, an abort in a C++ library's teardown) leaves the Python
stack of every thread in its log, where a traceback would be for a Python error: the worker turns on faulthandler
before anything else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from conftest import PROJECT

# the worker's main up to its argument parser (--help: no torch, no run), then a native death
CRASH = """
import contextlib, os, signal
from toolkit.runs import worker
with contextlib.suppress(SystemExit):
    worker.main(["--help"])
def where_it_died():
    os.kill(os.getpid(), signal.{name})
where_it_died()
"""


@pytest.mark.parametrize("name, fatal", [("SIGABRT", "Aborted"), ("SIGSEGV", "Segmentation fault")])
def test_a_rank_that_dies_in_native_code_names_where_in_python(name, fatal, tmp_path):
    # not PYTHONFAULTHANDLER from the caller (it would turn faulthandler on whatever the worker does); a core file, on
    # a host that writes them, lands in tmp_path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    env["PYTHONPATH"] = str(PROJECT)
    done = subprocess.run([sys.executable, "-c", CRASH.format(name=name)], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path)
    assert done.returncode == -getattr(signal, name), done.stderr
    assert f"Fatal Python error: {fatal}" in done.stderr, done.stderr
    assert "in where_it_died" in done.stderr, done.stderr
