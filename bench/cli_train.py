"""`python -m toolkit train CONFIG --set ...` as a user types it, for the benchmarks that time the path users run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from toolkit.rundir import RunDir  # noqa: E402


def train(config: str, run_dir: Path, settings: list[str], env: dict | None = None) -> RunDir:
    """The finished run; a failed one ends the benchmark with the end of its stderr."""
    proc = subprocess.run([sys.executable, "-m", "toolkit", "train", config, "--run-dir", str(run_dir),
                           *[a for s in settings for a in ("--set", s)]],
                          capture_output=True, text=True, cwd=PROJECT, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"trainbook train {config} {' '.join(settings)} failed:\n{proc.stderr[-2000:]}")
    return RunDir(run_dir)
