"""What several verbs share: their common options (--workspace, --json, --set, --trust-run, --max-restarts), the
config overrides their flags stand for, and how a listing prints its workspace and its JSON."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from toolkit.config import ConfigError
from toolkit.errors import not_allowed

SET_METAVAR = "SECTION.FIELD=VALUE"


def add_workspace(parser, *, below_group: bool = False) -> None:
    """--workspace on a verb that reads or writes the workspace. ``below_group``: a sub-verb of a group that takes
    it too (``data --workspace W list`` and ``data list --workspace W`` both work; the later one wins)."""
    parser.add_argument(
        "--workspace",
        metavar="FOLDER",
        default=argparse.SUPPRESS if below_group else None,
        help="workspace folder (default: $TRAINBOOK_WORKSPACE or ./.trainbook)",
    )


def add_json(parser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON (shapes: README, 'For scripts')")


def add_set(parser, help: str = "override one config field (repeatable)") -> None:
    parser.add_argument("--set", action="append", metavar=SET_METAVAR, help=help)


def add_trust_run(parser) -> None:
    parser.add_argument(
        "--trust-run",
        action="store_true",
        help="honour this run's config even if it came from elsewhere: the code it names "
        "(model.factory, model.loss), the addresses (tracking.mlflow_uri, a hub id in "
        "model.hf.source) and debug.enabled's port; read config.yaml first",
    )


def add_max_restarts(parser) -> None:
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="restart dead training processes from the latest checkpoint up to N times",
    )


def check_max_restarts(value: int) -> None:
    if value < 0:
        raise ConfigError(not_allowed("--max-restarts", value, "0 or more", problem="is negative"))


def config_overrides(sets, *, nproc: int | None = None, engine: str | None = None) -> list[str]:
    """The --set overrides, then the fields that --nproc and --engine stand for, where given."""
    overrides = list(sets or [])
    if nproc is not None:
        overrides.append(f"engine.nproc={nproc}")
    if engine is not None:
        overrides.append(f"engine.name={engine}")
    return overrides


def print_json(document) -> None:
    """One JSON document on stdout: the shapes are documented in the README ("For scripts")."""
    print(json.dumps(document, indent=1, default=str))


def listing_json(ws, key: str, items: list) -> dict:
    """A listing's JSON document: the workspace it read (None: there is none yet) and its items."""
    return {"workspace": str(ws.root) if ws else None, key: items}


def workspace_path(ws, path) -> Path:
    """Where the workspace is (``ws``, opened) or would be (None: the folder --workspace or the default names)."""
    from toolkit.catalogue.workspace import default_path

    return ws.root if ws else Path(path or default_path()).resolve()


def workspace_line(ws, path) -> str:
    return f"workspace: {workspace_path(ws, path)}" + ("" if ws else " (none yet)")


def local_time(seconds: float) -> str:
    """A listing's timestamp: the local date and time to the second."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
