"""The workspace's table of runs: which run directory trained what, on which data, with which engine."""

from __future__ import annotations

import time

from toolkit import config as config_mod
from toolkit.rundir import RunDir


def index_run(run: RunDir, config: config_mod.Config) -> None:
    """Record the run in its workspace's catalogue, so `trainbook runs` can say what was trained on what."""
    from toolkit.catalogue.workspace import Workspace

    with Workspace.open(config.data.workspace or None).transaction() as conn:
        conn.execute(
            "INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                str(run.path.resolve()),
                config.name,
                time.time(),
                config.fingerprint(),
                config.data.asset
                or (f"path:{config.data.path}" if config.data.path else f"builtin:{config.data.dataset}"),
                config.engine.name,
                config.engine.nproc,
            ),
        )


def list_runs(workspace=None, data: str | None = None) -> list[dict]:
    """Indexed runs, newest first, with their live state from status.json; ``data`` filters by asset name."""
    from toolkit.catalogue.workspace import Workspace

    ws = Workspace.existing(workspace)
    if ws is None:  # nothing trained here yet: looking must not create a workspace
        return []
    conn = ws.connect()
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM runs ORDER BY created DESC")]
    finally:
        conn.close()
    if data is not None:
        rows = [r for r in rows if r["data"] == data or r["data"].split(":")[0] == data]
    for row in rows:
        status = RunDir(row["run_dir"]).read_status()
        row["state"], row["step"] = status.get("state", "missing"), status.get("step")
    return rows
