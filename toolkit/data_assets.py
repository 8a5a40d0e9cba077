"""Data assets: named, versioned, immutable snapshots of files and folders (Azure ML's Data, offline).

``register("pydoc", "corpus.txt", type="uri_file")`` hashes the content, snapshots it into the workspace
datastore (content-addressed: one blob per distinct file, hard-linked where the filesystem allows), and
records ``pydoc:1``. Registering identical content again returns the existing version; changed content gets
the next one. A version never changes under a run, and archived versions stay resolvable by exact reference.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from toolkit.checkpoint_store import HASH_CHUNK, sha256_file
from toolkit.workspace import Workspace

TYPES = ("uri_file", "uri_folder", "mltable")
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
SMALL_BLOB_BYTES = 1 << 20
SNAPSHOT_THREADS = 4


class DataAssetError(ValueError):
    """A registration or reference that cannot be honoured; the message names the field and what is allowed."""


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

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


def _files_of(path: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of every file under a folder, sorted. A symbolic link is snapshotted as the file it
    points to if that lies inside the folder; one pointing outside is refused, never followed."""
    root = path.resolve()
    files = []
    for p in sorted(path.rglob("*")):
        if p.is_symlink():
            target = p.resolve()
            if not target.is_relative_to(root):
                raise DataAssetError(f"path: {str(p)!r} is a link to {str(target)!r}, outside {str(root)!r}; "
                                     "allowed: links to files inside the registered folder")
        if p.is_file():
            files.append((p.relative_to(path).as_posix(), p))
    if not files:
        raise DataAssetError(f"path: {str(path)!r} is an empty folder; allowed: a folder with at least one file")
    return files


def registration_problems(name: str, path: str | Path, type: str) -> dict[str, str]:
    """Every field of a registration that would be refused, as {field: message naming value and allowed}.
    Empty when ``register`` can go ahead (it then still checks an mltable's content and folder links)."""
    problems = {}
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        problems["name"] = (f"name: {name!r} is not allowed; allowed: letters, digits, '_', '-', '.', starting "
                            "with a letter or digit, at most 255 characters")
    if type not in TYPES:
        problems["type"] = f"type: {type!r} is not allowed; allowed: {', '.join(TYPES)}"
    if not str(path).strip():
        problems["path"] = "path: empty; allowed: an existing file or folder"
        return problems
    path = Path(path).expanduser()
    if not path.exists():
        problems["path"] = f"path: {str(path)!r} does not exist; allowed: an existing file or folder"
    elif type == "uri_file" and not path.is_file():
        problems["path"] = f"path: {str(path)!r} is not a file; allowed for type uri_file: a single file"
    elif type in ("uri_folder", "mltable") and not path.is_dir():
        problems["path"] = f"path: {str(path)!r} is not a folder; allowed for type {type}: a folder"
    elif type == "mltable" and not (path / "MLTable").is_file():
        problems["path"] = (f"path: {str(path)!r} has no MLTable file; allowed for type mltable: a folder with an "
                            "MLTable file describing the table")
    return problems


def _validate(name: str, path: Path, type: str) -> None:
    problems = registration_problems(name, path, type)
    if problems:
        raise DataAssetError(next(iter(problems.values())))


def _check_mltable(folder: Path) -> None:
    from toolkit.mltable import MLTableError, load_mltable

    try:
        load_mltable(folder)
    except (MLTableError, ValueError, KeyError, TypeError, OSError) as exc:
        raise DataAssetError(f"path: {str(folder)!r}: its files do not match its MLTable ({exc}); allowed: an "
                             "MLTable whose paths exist and whose columns convert to the declared types") from None


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:  # another filesystem, or links not allowed: a copy is as good, just bigger
        shutil.copy2(src, dest)


def _store_blob(path: Path, blobs: Path) -> str:
    """Copy one file into the content-addressed store; returns its sha256. An unreadable file stops the
    registration before the catalogue is touched (blobs already stored are content-addressed: harmless)."""
    try:
        return _copy_into_store(path, blobs)
    except PermissionError as exc:
        raise DataAssetError(f"path: {str(path)!r} cannot be read ({exc.strerror}); allowed: readable files") from None


def _copy_into_store(path: Path, blobs: Path) -> str:
    """Copy one file into the content-addressed store; returns its sha256.

    Small files are read once: hashed from memory and written from the same bytes, so the blob is what was
    hashed even if the source changes meanwhile. Large files are hashed while copied, then checked again.
    """
    if path.stat().st_size <= SMALL_BLOB_BYTES:
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        blob = blobs / digest
        if not blob.exists():
            tmp = blobs / f".{digest}.{uuid.uuid4().hex}.tmp"
            tmp.write_bytes(data)
            os.chmod(tmp, 0o444)
            os.replace(tmp, blob)  # killed before this line: only a .tmp file is left, never a wrong blob
        return digest
    tmp = blobs / f".{uuid.uuid4().hex}.tmp"
    hasher = hashlib.sha256()
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        while chunk := src.read(HASH_CHUNK):
            hasher.update(chunk)
            dst.write(chunk)
    digest = hasher.hexdigest()
    blob = blobs / digest
    if blob.exists():
        tmp.unlink()
    else:
        if sha256_file(tmp) != digest:
            tmp.unlink()
            raise DataAssetError(f"path: {str(path)!r} changed while it was being registered; try again")
        os.chmod(tmp, 0o444)
        os.replace(tmp, blob)
    return digest


def content_hash(type: str, listing: list[dict]) -> str:
    """An asset's identity: its type and every file's name, hash and size (a rename is a new version too)."""
    return hashlib.sha256(json.dumps([type, listing], sort_keys=True).encode()).hexdigest()


def store_snapshot(ws: Workspace, source: Path, type: str) -> tuple[str, int, int, str]:
    """Content-address ``source`` into the datastore. Returns (sha256, size, file count, snapshot path)."""
    files = [(source.name, source)] if type == "uri_file" else _files_of(source)
    if type == "mltable":
        _check_mltable(source)
    blobs = ws.datastore / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    # File I/O releases the GIL: a few threads overlap the many small reads and writes of a folder asset.
    with ThreadPoolExecutor(max_workers=SNAPSHOT_THREADS) as pool:
        digests = list(pool.map(lambda item: _store_blob(item[1], blobs), files))
    listing = [{"name": rel, "sha256": digest, "size": (blobs / digest).stat().st_size}
               for (rel, _), digest in zip(files, digests)]
    content = content_hash(type, listing)
    snapshot = ws.datastore / "snapshots" / content
    if not snapshot.exists():
        tmp = snapshot.with_name(f".{content}.{uuid.uuid4().hex}.tmp")
        for entry in listing:
            dest = tmp / entry["name"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(blobs / entry["sha256"], dest)
        (tmp / LISTING).write_text(json.dumps(listing, indent=1))
        try:
            os.rename(tmp, snapshot)
        except OSError:  # another process published the same content first: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    os.sync()  # one flush for all new blobs and links before the catalogue commits (fsync per file: ~10x slower)
    rel_snapshot = snapshot.relative_to(ws.root).as_posix()
    if type == "uri_file":
        rel_snapshot += "/" + source.name
    return content, sum(e["size"] for e in listing), len(listing), rel_snapshot


def _row_to_asset(ws: Workspace, row) -> DataAsset:
    return DataAsset(name=row["name"], version=row["version"], type=row["type"], sha256=row["sha256"],
                     size_bytes=row["size_bytes"], file_count=row["file_count"], created=row["created"],
                     source=row["source"], description=row["description"], tags=json.loads(row["tags"]),
                     archived=bool(row["archived"]), path=ws.root / row["snapshot"])


def register(ws: Workspace, name: str, path: str | Path, type: str = "uri_folder", description: str = "",
             tags: dict | None = None) -> DataAsset:
    """Snapshot ``path`` and record it as the next version of ``name`` (or return the version it already is)."""
    source = Path(path).expanduser()
    _validate(name, source, type)
    tags = dict(tags or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items()):
        raise DataAssetError(f"tags: {tags!r} is not allowed; allowed: a mapping of strings to strings")
    sha256, size, count, snapshot = store_snapshot(ws, source.resolve(), type)
    with ws.transaction() as conn:
        existing = conn.execute("SELECT * FROM data_assets WHERE name = ? AND sha256 = ? AND type = ? "
                                "ORDER BY version DESC LIMIT 1", (name, sha256, type)).fetchone()
        if existing is not None:
            return _row_to_asset(ws, existing)
        version = conn.execute("SELECT COALESCE(MAX(version), 0) + 1 FROM data_assets WHERE name = ?",
                               (name,)).fetchone()[0]
        conn.execute("INSERT INTO data_assets (name, version, type, sha256, size_bytes, file_count, created, "
                     "source, description, tags, snapshot) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                     (name, version, type, sha256, size, count, time.time(), str(source.resolve()), description,
                      json.dumps(tags, sort_keys=True), snapshot))
        row = conn.execute("SELECT * FROM data_assets WHERE name = ? AND version = ?", (name, version)).fetchone()
    return _row_to_asset(ws, row)


def parse_ref(ref: str) -> tuple[str, int | None]:
    name, sep, version = str(ref).partition(":")
    if not NAME_RE.fullmatch(name) or (sep and not version.isdigit()) or (sep and int(version) < 1):
        raise DataAssetError(f"data asset: {ref!r} is not a reference; allowed: 'name' (latest) or 'name:version' "
                             "with a version of 1 or more")
    return name, int(version) if sep else None


def get(ws: Workspace, ref: str) -> DataAsset:
    """``name:version`` (archived ones included: old runs stay reproducible) or ``name`` (latest not archived)."""
    name, version = parse_ref(ref)
    conn = ws.connect()
    try:
        if version is None:
            row = conn.execute("SELECT * FROM data_assets WHERE name = ? AND archived = 0 ORDER BY version DESC "
                               "LIMIT 1", (name,)).fetchone()
        else:
            row = conn.execute("SELECT * FROM data_assets WHERE name = ? AND version = ?", (name, version)).fetchone()
        if row is None:
            known = [f"{r['name']}:{r['version']}" for r in conn.execute(
                "SELECT name, version FROM data_assets WHERE name = ? ORDER BY version", (name,))]
            raise DataAssetError(f"data asset: {ref!r} is not registered; "
                                 + (f"versions of {name}: {', '.join(known)}" if known else "no asset has that name"))
        return _row_to_asset(ws, row)
    finally:
        conn.close()


def list_assets(ws: Workspace, name: str | None = None, include_archived: bool = False,
                tag: str | None = None) -> list[DataAsset]:
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


def archive(ws: Workspace, ref: str) -> DataAsset:
    """Hide a version from listings and from 'name' (latest) look-ups; it stays resolvable as name:version."""
    name, version = parse_ref(ref)
    if version is None:
        raise DataAssetError(f"data asset: {ref!r} names no version; allowed: 'name:version' (archive is explicit)")
    asset = get(ws, ref)
    with ws.transaction() as conn:
        conn.execute("UPDATE data_assets SET archived = 1 WHERE name = ? AND version = ?", (name, version))
    return get(ws, asset.ref)


LISTING = ".listing.json"


def open_path(path: str | Path, hash: bool = True) -> DataAsset:
    """A file or folder read in place, without the catalogue: how a job sees its data input (Azure ML mounts the
    asset's uploaded snapshot). The type follows the contents: a file is uri_file, a folder with an MLTable file
    is mltable, any other folder uri_folder. A snapshot folder keeps its listing, so the hash (and the run's
    lineage) is the registered asset's own."""
    path = Path(path).expanduser()
    if not path.exists():
        raise DataAssetError(f"data.path: {str(path)!r} does not exist; allowed: an existing file or folder")
    type = "uri_file" if path.is_file() else "mltable" if (path / "MLTable").is_file() else "uri_folder"
    if not hash:  # only the type is wanted (a check before launch): no need to read the data
        listing = []
    elif type == "uri_file":
        listing = [{"name": path.name, "sha256": sha256_file(path), "size": path.stat().st_size}]
    elif (path / LISTING).is_file():
        listing = json.loads((path / LISTING).read_text())
    else:
        listing = [{"name": rel, "sha256": sha256_file(p), "size": p.stat().st_size} for rel, p in _files_of(path)
                   if not rel.startswith(".")]
    return DataAsset(name=path.name, version=0, type=type, sha256=content_hash(type, listing) if hash else "",
                     size_bytes=sum(e["size"] for e in listing), file_count=len(listing), created=path.stat().st_mtime,
                     source=str(path), description="", tags={}, archived=False, path=path)


def folder_files(asset: DataAsset) -> list[Path]:
    """The files of a folder asset in name order, from its listing (a snapshot) or by walking it (a plain folder)."""
    if (asset.path / LISTING).is_file():
        names = [entry["name"] for entry in json.loads((asset.path / LISTING).read_text())]
    else:
        names = [rel for rel, _ in _files_of(asset.path) if not rel.startswith(".")]
    return [asset.path / name for name in sorted(names)]
