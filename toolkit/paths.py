"""Where things live by default. Environment variables override, so workshops and CI can redirect them."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def runs_root() -> Path:
    """Default parent of run directories: $TRAINBOOK_RUNS, else <project>/runs."""
    return Path(os.environ.get("TRAINBOOK_RUNS", PROJECT_ROOT / "runs"))


def cache_dir() -> Path:
    """Per-user cache (measured matmul peak, token files keyed by content hash): $TRAINBOOK_CACHE, else
    ~/.cache/trainbook."""
    return Path(os.environ.get("TRAINBOOK_CACHE", Path.home() / ".cache" / "trainbook"))
