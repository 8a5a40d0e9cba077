"""Where things live by default. Environment variables override, so workshops and CI can redirect them."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CATALOGUE_NAME = "catalogue.sqlite"  # a folder is a workspace once it holds this


def in_checkout() -> bool:
    """True when toolkit runs from the project folder (a checkout or an editable install), False from a wheel,
    whose PROJECT_ROOT is site-packages."""
    return (PROJECT_ROOT / "pyproject.toml").is_file()


def runs_root() -> Path:
    """Default parent of run directories: $TRAINBOOK_RUNS, else <project>/runs in a checkout, else ./runs
    (never site-packages)."""
    default = PROJECT_ROOT / "runs" if in_checkout() else Path.cwd() / "runs"
    return Path(os.environ.get("TRAINBOOK_RUNS", default))


def cache_dir() -> Path:
    """Per-user cache (measured matmul peak, token files keyed by content hash): $TRAINBOOK_CACHE, else
    ~/.cache/trainbook."""
    return Path(os.environ.get("TRAINBOOK_CACHE", Path.home() / ".cache" / "trainbook"))


def user_config_dir() -> Path:
    """Per-user settings and the key that signs this user's runs (toolkit.trust): $TRAINBOOK_CONFIG_HOME, else
    $XDG_CONFIG_HOME/trainbook, else ~/.config/trainbook. Never inside a project or a workspace, which travel."""
    if os.environ.get("TRAINBOOK_CONFIG_HOME"):
        return Path(os.environ["TRAINBOOK_CONFIG_HOME"])
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "trainbook"


# Every Python process Trainbook starts (`python -m ...`: the supervisor and so every rank, followers, servers) gets
# this: without it `-m` puts the current folder first on sys.path, so a `toolkit/` or `torch.py` in a run directory
# one resumes from would be imported instead of the real one. Python 3.11+ reads it (3.10 ignores it).
SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}
