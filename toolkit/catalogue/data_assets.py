"""Data assets: named, versioned, immutable snapshots of files and folders (Azure ML's Data, offline).

``register("pydoc", "corpus.txt", type="uri_file")`` hashes the content, snapshots it into the workspace
datastore (content-addressed: one blob per distinct file, hard-linked where the filesystem allows), and
records ``pydoc:1``. Registering identical content again returns the existing version; changed content gets
the next one. A version never changes under a run, and archived versions stay resolvable by exact reference.

This module is the catalogue of data assets: it owns the rows of the workspace's ``data_assets`` table (name,
version, content hash, the snapshot's path, description, tags, archived) and the checks a registration must
pass. The bytes are the datastore's (:mod:`toolkit.catalogue.data_store` owns ``datastore/``: blobs, listings,
snapshots); checking and repairing a whole workspace is :mod:`toolkit.catalogue.data_verify`'s. A snapshot made
by an older Trainbook (its listing inside it) is rebuilt on its first read (:func:`open_asset`, as training
does), by ``verify(repair=True)`` or by registering the same content again.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from toolkit import names
from toolkit.errors import not_allowed, refused
from toolkit.fsio import read_hashed
from toolkit.catalogue.data_store import (
    OLD_LISTING,
    DataAssetError,
    blob_states,
    content_hash,
    files_of,
    publish,
    snapshot_folder,
    store_snapshot,
    version_listing,
)
from toolkit.catalogue.workspace import Workspace

TYPES = ("uri_file", "uri_folder", "mltable")


@dataclass(frozen=True)
class DataAsset:
    name: str
    version: int
    type: str
    sha256: str
    size_bytes: int
    file_count: int
    created: float
    source: str
    description: str
    tags: dict
    archived: bool
    path: Path  # the immutable snapshot: a file for uri_file, a folder otherwise
    # every file's name, sha256 and size: as hashed when this object did the hashing (open_path), as registered
    # from open_asset; empty from get and list_assets (a registered asset's listing stays in the datastore)
    listing: tuple = field(default=(), compare=False, repr=False)

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


def registration_problems(name: str, path: str | Path, type: str | None) -> dict[str, str]:
    """Every field of a registration that would be refused, as {field: message naming value and allowed}.
    Empty when ``register`` can go ahead (it then still checks an mltable's content and folder links).
    ``type`` None: the one the path calls for."""
    problems = {}
    if problem := names.name_problem("name", name):
        problems["name"] = problem
    if type is None and Path(path).expanduser().exists():
        type = type_of(Path(path).expanduser())
    if type is not None and type not in TYPES:
        problems["type"] = not_allowed("type", type, ", ".join(TYPES))
    if not str(path).strip():
        problems["path"] = refused("path", "empty", "an existing file or folder")
        return problems
    path = Path(path).expanduser()
    if not path.exists():
        problems["path"] = not_allowed("path", path, "an existing file or folder", problem="does not exist")
    elif type == "uri_file" and path.is_symlink() and path.is_file():
        # Refused, as a folder refuses links that leave it: followed, the asset's file would silently take the
        # target's name (the name is part of its identity) and the source would not be what was typed.
        target = str(path.resolve())
        problems["path"] = not_allowed(
            "path",
            path,
            f"a regular file (type uri_file: register {target!r} itself)",
            problem=f"is a symbolic link to {target!r}",
        )
    elif type == "uri_file" and not path.is_file():
        problems["path"] = not_allowed("path", path, "a single file (type uri_file)", problem="is not a file")
    elif type in ("uri_folder", "mltable") and not path.is_dir():
        problems["path"] = not_allowed("path", path, f"a folder (type {type})", problem="is not a folder")
    elif type == "mltable" and not (path / "MLTable").is_file():
        problems["path"] = not_allowed(
            "path",
            path,
            "a folder with an MLTable file describing the table (type mltable)",
            problem="has no MLTable file",
        )
    return problems


def _validate(name: str, path: Path, type: str) -> None:
    problems = registration_problems(name, path, type)
    if problems:
        raise DataAssetError(next(iter(problems.values())))


def _check_mltable(folder: Path) -> None:
    from toolkit.catalogue.mltable import MLTableError, MLTablePathError, load_mltable

    try:
        load_mltable(folder)
    except MLTablePathError as exc:  # a path leaving the folder: the rows could change after registration
        raise DataAssetError(f"path: {str(folder)!r}: {exc}") from None
    except (MLTableError, ValueError, KeyError, TypeError, OSError) as exc:
        raise DataAssetError(
            not_allowed(
                "path",
                folder,
                "an MLTable whose paths exist and whose columns convert to the declared types",
                problem=f"holds files that do not match its MLTable ({exc})",
            )
        ) from None


def _row_to_asset(ws: Workspace, row) -> DataAsset:
    return DataAsset(
        name=row["name"],
        version=row["version"],
        type=row["type"],
        sha256=row["sha256"],
        size_bytes=row["size_bytes"],
        file_count=row["file_count"],
        created=row["created"],
        source=row["source"],
        description=row["description"],
        tags=json.loads(row["tags"]),
        archived=bool(row["archived"]),
        path=ws.root / row["snapshot"],
    )


def type_of(path: Path) -> str:
    """The asset type a path's contents call for: a file is uri_file, a folder with an MLTable file is mltable, any
    other folder uri_folder."""
    return "uri_file" if path.is_file() else "mltable" if (path / "MLTable").is_file() else "uri_folder"


def register(
    ws: Workspace, name: str, path: str | Path, type: str | None = None, description: str = "", tags: dict | None = None
) -> DataAsset:
    """Snapshot ``path`` and record it as the next version of ``name`` (or return the version it already is).
    ``type`` None: the one the path's contents call for (:func:`type_of`)."""
    source = Path(path).expanduser()
    if type is None and source.exists():
        type = type_of(source)
    _validate(name, source, type)
    tags = dict(tags or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise DataAssetError(not_allowed("tags", tags, "a mapping of strings to strings"))
    resolved = source.resolve()
    source_files = files_of(resolved, type)
    if type == "mltable":  # after files_of: a link leaving the folder is refused before the table is read
        _check_mltable(resolved)
    sha256, size, count, snapshot = store_snapshot(
        ws, source_files, type, root=resolved.parent if type == "uri_file" else resolved
    )
    with ws.transaction() as conn:
        existing = conn.execute(
            "SELECT * FROM data_assets WHERE name = ? AND sha256 = ? AND type = ? ORDER BY version DESC LIMIT 1",
            (name, sha256, type),
        ).fetchone()
        if existing is not None:
            if existing["snapshot"] != snapshot:  # recorded elsewhere (a damaged row): serve the one just checked
                conn.execute(
                    "UPDATE data_assets SET snapshot = ? WHERE name = ? AND version = ?",
                    (snapshot, name, existing["version"]),
                )
                existing = conn.execute(
                    "SELECT * FROM data_assets WHERE name = ? AND version = ?", (name, existing["version"])
                ).fetchone()
            return _row_to_asset(ws, existing)
        version = conn.execute(
            "SELECT COALESCE(MAX(version), 0) + 1 FROM data_assets WHERE name = ?", (name,)
        ).fetchone()[0]
        conn.execute(
            "INSERT INTO data_assets (name, version, type, sha256, size_bytes, file_count, created, "
            "source, description, tags, snapshot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                name,
                version,
                type,
                sha256,
                size,
                count,
                time.time(),
                str(source.resolve()),
                description,
                json.dumps(tags, sort_keys=True),
                snapshot,
            ),
        )
        row = conn.execute("SELECT * FROM data_assets WHERE name = ? AND version = ?", (name, version)).fetchone()
    return _row_to_asset(ws, row)


def parse_ref(ref: str) -> tuple[str, int | None]:
    return names.parse_ref(ref, "data asset", DataAssetError)


def _row(ws: Workspace, ref: str):
    """The catalogue row of ``name:version`` (archived ones included: old runs stay reproducible) or ``name``
    (latest not archived); refuses an unknown reference, naming the versions that exist."""
    name, version = parse_ref(ref)
    conn = ws.connect()
    try:
        if version is None:
            row = conn.execute(
                "SELECT * FROM data_assets WHERE name = ? AND archived = 0 ORDER BY version DESC LIMIT 1", (name,)
            ).fetchone()
        else:
            row = conn.execute("SELECT * FROM data_assets WHERE name = ? AND version = ?", (name, version)).fetchone()
        if row is None:
            known = [
                f"{r['name']}:{r['version']}"
                for r in conn.execute("SELECT name, version FROM data_assets WHERE name = ? ORDER BY version", (name,))
            ]
            raise DataAssetError(
                f"data asset: {ref!r} is not registered; "
                + (f"versions of {name}: {', '.join(known)}" if known else "no asset has that name")
            )
        return row
    finally:
        conn.close()


def get(ws: Workspace, ref: str) -> DataAsset:
    """``name:version`` (archived ones included: old runs stay reproducible) or ``name`` (latest not archived).
    Its description only; to read its files, :func:`open_asset`."""
    return _row_to_asset(ws, _row(ws, ref))


def open_asset(ws: Workspace, ref: str) -> DataAsset:
    """A registered version ready to be read, as training reads it: :func:`get` with the version's listing
    attached, so :func:`asset_files` names exactly the registered files and never walks the snapshot (a file
    that is not in the listing is never read). A snapshot not in the current layout (made by an older Trainbook,
    whose listing inside it is accepted only if it hashes to the registered content; or missing, a rebuild
    having been killed) is rebuilt first through the repair path, from intact blobs only: the next reader, a job
    mounting the snapshot included, finds exactly the user's files."""
    row = _row(ws, ref)
    listing, found, old_layout = version_listing(ws, row)
    if listing is None:
        raise DataAssetError(f"data asset: {row['name']}:{row['version']} cannot be read: {found[0]}")
    folder = snapshot_folder(ws, row)
    why = (
        "is missing or not a folder"
        if folder.is_symlink() or not folder.is_dir()
        else "was made by an older Trainbook"
        if old_layout or _holds_old_listing(folder, listing)
        else None
    )
    if why:
        row = _rebuild_for_use(ws, row, listing, why)
    return replace(_row_to_asset(ws, row), listing=tuple(listing))


def _holds_old_listing(folder: Path, listing: list[dict]) -> bool:
    """Whether a snapshot folder still holds an older Trainbook's own listing (and so, often, its token cache): a
    rebuild put the listing in listings/ but was killed before the snapshot was swapped. No file is read."""
    return os.path.lexists(folder / OLD_LISTING) and all(entry["name"] != OLD_LISTING for entry in listing)


def _rebuild_for_use(ws: Workspace, row, listing: list[dict], why: str):
    """Rebuild a version's snapshot in the current layout before it is read (its blobs re-hashed first: only
    intact ones are linked); returns its row. One that cannot be rebuilt is refused, saying which stored file is
    damaged and what to do: the user's bytes did not change, the store's copy of them did."""
    ref = f"{row['name']}:{row['version']}"
    states, _ = blob_states(ws, {entry["sha256"] for entry in listing}, progress=True)
    repaired = repair_version(ws, row, listing, states)
    if repaired is not None:
        return repaired
    entry = next(entry for entry in listing if states[entry["sha256"]])
    raise DataAssetError(
        f"data asset: {ref} cannot be read: its snapshot {why} and cannot be rebuilt, because the datastore's copy of "
        f"{entry['name']!r} (blob {entry['sha256']}) {states[entry['sha256']]}; nothing was read. "
        f"`trainbook data verify --repair` rebuilds every version it can and names each damaged file; to replace "
        f"the damaged copy, register the source of {ref} again (`trainbook data register {row['name']} "
        f"{row['source']}`)"
    )


def list_assets(
    ws: Workspace, name: str | None = None, include_archived: bool = False, tag: str | None = None
) -> list[DataAsset]:
    """Registered versions, newest first; ``tag`` is 'key' or 'key=value'."""
    query, args = "SELECT * FROM data_assets WHERE 1 = 1", []
    if name is not None:
        query += " AND name = ?"
        args.append(name)
    if not include_archived:
        query += " AND archived = 0"
    conn = ws.connect()
    try:
        rows = conn.execute(query + " ORDER BY name, version DESC", args).fetchall()
    finally:
        conn.close()
    assets = [_row_to_asset(ws, r) for r in rows]
    if tag is not None:
        key, _, value = tag.partition("=")
        assets = [a for a in assets if key in a.tags and (not value or a.tags[key] == value)]
    return assets


def version_holding(ws: Workspace, name: str, sha256: str) -> DataAsset | None:
    """The newest registered single-file version of ``name`` whose file has exactly this content (sha256): what a
    run that read a built-in corpus from its source (data.dataset) trained on, in the workspace's terms."""
    for asset in (a for a in list_assets(ws, name, include_archived=True) if a.type == "uri_file"):
        listing, _, _ = version_listing(ws, _row(ws, asset.ref))
        if listing and len(listing) == 1 and listing[0]["sha256"] == sha256:
            return asset
    return None


def archive(ws: Workspace, ref: str) -> DataAsset:
    """Hide a version from listings and from 'name' (latest) look-ups; it stays resolvable as name:version."""
    name, version = parse_ref(ref)
    if version is None:
        raise DataAssetError(
            not_allowed("data asset", ref, "'name:version' (archive is explicit)", problem="names no version")
        )
    asset = get(ws, ref)
    with ws.transaction() as conn:
        conn.execute("UPDATE data_assets SET archived = 1 WHERE name = ? AND version = ?", (name, version))
    return get(ws, asset.ref)


def open_path(path: str | Path, hash: bool = True) -> DataAsset:
    """A file or folder read in place, without the catalogue: how a job sees its data input (Azure ML mounts the
    asset's uploaded snapshot). The type follows the contents: a file is uri_file, a folder with an MLTable file
    is mltable, any other folder uri_folder. The files are hashed by the registration's own rule, so a snapshot
    read in place has the registered asset's hash (and the run's lineage names it)."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataAssetError(not_allowed("data.path", path, "an existing file or folder", problem="does not exist"))
    type = type_of(path)
    listing = []
    if hash:  # else only the type is wanted (a check before launch): no need to read the data
        for rel, file in files_of(path, type):
            digest, size = read_hashed(file)
            listing.append({"name": rel, "sha256": digest, "size": size})
    return DataAsset(
        name=path.name,
        version=0,
        type=type,
        sha256=content_hash(type, listing) if hash else "",
        size_bytes=sum(e["size"] for e in listing),
        file_count=len(listing),
        created=path.stat().st_mtime,
        source=str(path),
        description="",
        tags={},
        archived=False,
        path=path,
        listing=tuple(listing),
    )


def asset_files(asset: DataAsset) -> list[tuple[str, Path]]:
    """(name in the listing, path) of every file of an asset, in content-hash order. A registered version's come
    from its listing (:func:`open_asset` attaches it), never from walking its snapshot: nothing but the registered
    files is read, whatever else the folder holds. A file or folder opened in place is walked by the
    registration's rule."""
    if not asset.version:
        return files_of(asset.path, asset.type)
    if not asset.listing:
        raise DataAssetError(
            f"data asset: {asset.ref} was looked up without its listing; read a registered "
            "version through data_assets.open_asset"
        )
    folder = asset.path.parent if asset.type == "uri_file" else asset.path
    return [(entry["name"], _registered_file(asset, folder, entry["name"])) for entry in asset.listing]


def _registered_file(asset: DataAsset, folder: Path, name: str) -> Path:
    """The snapshot's file ``name``, refused unless it is a regular file inside the folder: a copied workspace is
    untrusted, and a link or a fifo in a snapshot must not be followed or block the reader."""
    path = folder / name
    try:
        inside = path.parent.resolve() == folder.resolve() / PurePosixPath(name).parent
        regular = inside and stat.S_ISREG(path.lstat().st_mode)
        state = "is a link, or not a regular file, where the registered file belongs"
    except FileNotFoundError:
        regular, state = False, "is missing"
    if not regular:
        raise DataAssetError(
            f"data: {str(path)!r} of {asset.ref} {state}; nothing was read; `trainbook data verify "
            f"{asset.ref}` names the damage and `trainbook data verify --repair` rebuilds the "
            "snapshot from intact blobs"
        )
    return path


def check_unchanged(asset: DataAsset, listing: list[dict]) -> None:
    """Refuse bytes read from ``asset`` (``listing``: each file's name, sha256 and size as read, in
    :func:`asset_files` order) that are not the ones it was hashed as, naming the file where the asset carries
    its listing. What a run caches must be what its lineage records."""
    where = asset.ref if asset.version else repr(asset.source)
    if asset.listing:
        hashed = {entry["name"]: entry["sha256"] for entry in asset.listing}
        read = {entry["name"]: entry["sha256"] for entry in listing}
        for name in sorted(hashed.keys() | read.keys()):
            if hashed.get(name) != read.get(name):
                file = asset.path if asset.type == "uri_file" else asset.path / name
                if asset.version:  # read by its listing: a snapshot file whose bytes are not the stored ones
                    raise DataAssetError(
                        f"data: {str(file)!r} of {where} is not the file registered as {name!r} (sha256 "
                        f"{hashed[name]}); nothing was cached; `trainbook data verify {where}` names the damage and "
                        "`trainbook data verify --repair` rebuilds the snapshot from intact blobs"
                    )
                state = "appeared" if name not in hashed else "disappeared" if name not in read else "changed"
                raise DataAssetError(
                    not_allowed(
                        "data",
                        file,
                        "data that stays the same while a run reads it (start the run again to hash the new content)",
                        problem=f"{state} after it was hashed for {where}; nothing was cached",
                    )
                )
    if content_hash(asset.type, listing) == asset.sha256:
        return
    if asset.version:  # unreachable through open_asset (its listing hashes to the registration): a backstop
        raise DataAssetError(
            f"data: the files of {where} at {str(asset.path)!r} are not the bytes it was registered "
            f"with; nothing was cached; `trainbook data verify {asset.ref}` names the file"
        )
    raise DataAssetError(
        refused(
            "data",
            f"the files of {where} changed after they were hashed; nothing was cached",
            "data that stays the same while a run reads it",
        )
    )


def source_file(row, entry: dict) -> Path:
    """Where a version's file was registered from: a uri_file's source is the file itself, a folder's (or a
    table's) holds the file under its listed name. What a damaged blob can be restored from, if it is unchanged."""
    source = Path(row["source"])
    return source if row["type"] == "uri_file" else source / entry["name"]


def repair_version(ws: Workspace, row, listing: list[dict] | None, states: dict[str, str | None]):
    """Rebuild a version's snapshot (and its listing file) from its blobs if every one of them is intact
    (``states``: :func:`toolkit.catalogue.data_store.blob_states`) and record it in its row; returns the
    version's catalogue row as it is now, or None when it cannot be repaired."""
    if listing is None or any(states.get(e["sha256"]) for e in listing):
        return None
    _, rel = publish(ws, row["type"], listing)
    with ws.transaction() as conn:
        conn.execute(
            "UPDATE data_assets SET snapshot = ? WHERE name = ? AND version = ?", (rel, row["name"], row["version"])
        )
        return conn.execute(
            "SELECT * FROM data_assets WHERE name = ? AND version = ?", (row["name"], row["version"])
        ).fetchone()
