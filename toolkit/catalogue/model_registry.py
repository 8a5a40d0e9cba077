"""Registered models: an exported model folder, snapshotted into the workspace as ``name:version`` with its
lineage (Azure ML's Model asset, offline).

    model = register_model(ws, "outputs/runs/demo-.../model")       # -> demo:1, pointing back to the run
    get_model(ws, "demo").path                                      # the immutable snapshot to serve

Like data assets, versions follow content: registering the same export again returns its version; a new
export gets the next one. Each version records the run, the checkpoint and the data (name and hash) it came
from, so a served answer can be traced to the bytes it was trained on.
"""

from __future__ import annotations

import hashlib
import json

import time
from dataclasses import dataclass
from pathlib import Path

from toolkit import names
from toolkit.catalogue import data_assets
from toolkit.catalogue.data_store import DataAssetError, files_of, store_snapshot
from toolkit.catalogue.model_format import ExportError, read_manifest, verify_model_folder
from toolkit.catalogue.workspace import Workspace
from toolkit.errors import not_allowed, refused


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    version: int
    sha256: str
    size_bytes: int
    created: float
    run_dir: str
    checkpoint: str
    data: str
    data_sha256: str
    description: str
    path: Path  # the snapshot folder: serve and deploy from here, never from the run directory

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


def _row(ws: Workspace, row) -> RegisteredModel:
    return RegisteredModel(**{k: row[k] for k in row.keys() if k != "snapshot"}, path=ws.root / row["snapshot"])


def payload_hash(manifest: dict) -> str:
    """A model version's identity: its payload (weights, graph, config, tokenizer, parity, as the manifest lists
    them), not the manifest's export time: exporting the same checkpoint again (every notebook re-run) gives the
    same version. The catalogue keeps it; the manifest names every file's sha256; so the bytes served can be
    traced to the version asked for."""
    return hashlib.sha256(json.dumps(manifest["files"], sort_keys=True).encode()).hexdigest()


def register_model(
    ws: Workspace, model_dir: str | Path, name: str | None = None, description: str = ""
) -> RegisteredModel:
    """Snapshot an exported model folder and record it as the next version of ``name`` (default: the run's
    config name), or return the version it already is."""
    import yaml

    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)  # is it an export at all (cheap), before anything is copied
    if name is None:
        config = yaml.safe_load((model_dir / "config.yaml").read_text())
        name = str(config.get("name") if isinstance(config, dict) else manifest["model"])
    names.check_name(name, "name", DataAssetError)
    folder = model_dir.resolve()
    _, size, _, snapshot = store_snapshot(ws, files_of(folder, "uri_folder"), "uri_folder", root=folder)
    # The snapshot is what will be served: its bytes must be the ones its manifest (and so the version) names.
    manifest = verify_model_folder(ws.root / snapshot)
    sha256 = payload_hash(manifest)
    data = manifest.get("data") or {}
    asset = data.get("asset") or {}
    data_sha = data.get("sha256", "")
    # a built-in corpus read from its source: named by the registered version holding the same bytes, if any
    name_read = data.get("name")
    holding = (
        data_assets.version_holding(ws, name_read, data_sha)
        if not asset.get("ref") and isinstance(name_read, str) and isinstance(data_sha, str)
        else None
    )
    data_ref = asset.get("ref") or (holding.ref if holding else f"builtin:{data.get('name', '?')}")
    with ws.transaction() as conn:
        existing = conn.execute(
            "SELECT * FROM models WHERE name = ? AND sha256 = ? ORDER BY version DESC LIMIT 1", (name, sha256)
        ).fetchone()
        if existing is not None:
            return _row(ws, existing)
        version = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM models WHERE name = ?", (name,)).fetchone()[0]
        conn.execute(
            "INSERT INTO models (name, version, sha256, size_bytes, created, snapshot, run_dir, checkpoint, "
            "data, data_sha256, description) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                name,
                version,
                sha256,
                size,
                time.time(),
                snapshot,
                manifest["run_dir"],
                manifest["checkpoint"],
                data_ref,
                data_sha,
                description,
            ),
        )
        row = conn.execute("SELECT * FROM models WHERE name = ? AND version = ?", (name, version)).fetchone()
    return _row(ws, row)


def get_model(ws: Workspace, ref: str) -> RegisteredModel:
    """``name:version``, or ``name`` for the latest version."""
    name, version = names.parse_ref(ref, "model", DataAssetError)
    conn = ws.connect()
    try:
        if version is None:
            row = conn.execute("SELECT * FROM models WHERE name = ? ORDER BY version DESC LIMIT 1", (name,)).fetchone()
        else:
            row = conn.execute("SELECT * FROM models WHERE name = ? AND version = ?", (name, version)).fetchone()
        if row is None:
            known = [
                f"{r['name']}:{r['version']}"
                for r in conn.execute("SELECT name, version FROM models ORDER BY name, version")
            ]
            raise DataAssetError(f"model: {ref!r} is not registered; registered: {', '.join(known) or 'none'}")
        model = _row(ws, row)
    finally:
        conn.close()
    # Cheap (one small file): the snapshot's manifest must still be the registered version's. Its files are then
    # checked against the manifest by whoever loads them (toolkit.catalogue.model_format.verify_model_folder).
    try:
        registered = payload_hash(read_manifest(model.path)) == model.sha256
    except (ExportError, KeyError, TypeError):
        registered = False
    if not registered:
        raise DataAssetError(
            refused(
                "model",
                f"{model.ref}'s snapshot {str(model.path)!r} is not the registered version (its manifest lists "
                "other files)",
                "a model as registered (register its export again)",
            )
        )
    return model


def list_models(ws: Workspace) -> list[RegisteredModel]:
    conn = ws.connect()
    try:
        return [_row(ws, r) for r in conn.execute("SELECT * FROM models ORDER BY name, version DESC")]
    finally:
        conn.close()


def resolve_model_dir(model: str | Path, workspace: str | Path | None = None) -> Path:
    """A model folder given directly, or a registered ``name[:version]`` of the workspace."""
    path = Path(model).expanduser()
    if path.is_dir():
        read_manifest(path)
        return path
    if any(sep in str(model) for sep in ("/", "\\")) or not names.is_name(str(model).split(":")[0]):
        raise DataAssetError(
            not_allowed(
                "model",
                model,
                "a folder written by `trainbook export`, or NAME[:VERSION] from `trainbook models`",
                problem="is neither a folder nor a registered model",
            )
        )
    return get_model(Workspace.open(workspace), str(model)).path
