"""Shared helpers: run the real CLI in a subprocess, read a run directory."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.rundir import RunDir

PROJECT = Path(__file__).resolve().parent.parent


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m toolkit ARGS`` as a user would type it; stdout and stderr captured as text."""
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=PROJECT)


@pytest.fixture(autouse=True)
def private_workspace(tmp_path, monkeypatch):
    """Every test (and every process it starts) indexes runs and data in its own workspace."""
    monkeypatch.setenv("TRAINBOOK_WORKSPACE", str(tmp_path / "workspace"))


@pytest.fixture
def train_tiny(tmp_path):
    """Train configs/tiny.yaml through the CLI with extra flags; return (process, RunDir)."""

    def run(*flags: str, name: str = "run") -> tuple[subprocess.CompletedProcess, RunDir]:
        run_dir = tmp_path / name
        proc = cli("train", "tiny", "--run-dir", str(run_dir), *flags)
        return proc, RunDir(run_dir)

    return run


@pytest.fixture
def small_mount(tmp_path):
    """``with small_mount(options) as path:`` a real filesystem to fail on: a tmpfs of a given size (a full disk)
    or a read-only bind mount (Azure ML's ro_mount). Mounting needs root; elsewhere the test is skipped."""

    @contextlib.contextmanager
    def mount(*args: str):
        path = tmp_path / f"mount{len(list(tmp_path.glob('mount*')))}"
        path.mkdir()
        if subprocess.run(["mount", *args, str(path)], capture_output=True).returncode != 0:
            pytest.skip(f"cannot mount {' '.join(args)} here (needs root)")
        try:
            yield path
        finally:
            subprocess.run(["umount", "-l", str(path)])

    return mount
