"""Data assets: named, versioned, immutable snapshots of files and folders (Azure ML's Data, offline).

``register("pydoc", "corpus.txt", type="uri_file")`` hashes the content, snapshots it into the workspace
datastore (content-addressed: one blob per distinct file, hard-linked where the filesystem allows), and
records ``pydoc:1``. Registering identical content again returns the existing version; changed content gets
the next one. A version never changes under a run, and archived versions stay resolvable by exact reference.

This module owns the datastore's layout:

    datastore/
      blobs/<sha256>              each distinct file once, read-only; its name is the sha256 of its bytes
      listings/<content>.json     an asset's [type, listing]; the sha256 of these bytes is its content hash
      snapshots/<content>/        exactly the user's files (hard links to their blobs), nothing else

Every file is written under a '.tmp' name and renamed into place: nothing in the store is ever opened for
writing, so no write can reach a blob through one of its links, and a killed registration leaves only '.tmp'
leftovers. A snapshot holds the user's files and nothing else, so a job reading it in place (Azure ML mounts the
uploaded snapshot) hashes it to the registered asset. Older Trainbooks kept the listing inside the snapshot
(``.listing.json``): :func:`verify` reports such snapshots; the first read (:func:`open_asset`, as training
does), ``verify(repair=True)`` or registering the same content again rebuilds them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath

from toolkit import fsio, names
from toolkit.errors import not_allowed, refused
from toolkit.fsio import HASH_CHUNK, read_hashed, sha256_file
from toolkit.catalogue.workspace import Workspace

TYPES = ("uri_file", "uri_folder", "mltable")
SHA256_RE = fsio.SHA256_RE
SMALL_BLOB_BYTES = 1 << 20
SNAPSHOT_THREADS = 4
BLOBS, LISTINGS, SNAPSHOTS = "blobs", "listings", "snapshots"
TMP_SUFFIX = ".tmp"  # the only names a killed registration leaves behind; harmless, safe to delete
OLD_LISTING = ".listing.json"  # where Trainbook before the listings/ folder kept a listing: inside the snapshot


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
    # every file's name, sha256 and size: as hashed when this object did the hashing (open_path), as registered
    # from open_asset; empty from get and list_assets (a registered asset's listing stays in the datastore)
    listing: tuple = field(default=(), compare=False, repr=False)

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


def _files_of(path: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of every file under a folder: THE rule for which files make up a folder asset, at
    registration and when a folder (a snapshot, say) is read in place. Every file counts, dot-files too: a
    snapshot holds nothing but the user's files. A symbolic link is taken as the file it points to if that
    lies inside the folder; one pointing outside is refused, never followed. The order is the content hash's."""
    root = path.resolve()
    files = []
    for p in sorted(path.rglob("*")):
        if p.is_symlink():
            target = p.resolve()
            if not target.is_relative_to(root):
                raise DataAssetError(not_allowed(
                    "path", p, "links to files inside the registered folder",
                    problem=f"is a link to {str(target)!r}, outside {str(root)!r}"))
        if p.is_file():
            files.append((p.relative_to(path).as_posix(), p))
    if not files:
        raise DataAssetError(not_allowed("path", path, "a folder with at least one file", problem="is an empty folder"))
    return files


def registration_problems(name: str, path: str | Path, type: str) -> dict[str, str]:
    """Every field of a registration that would be refused, as {field: message naming value and allowed}.
    Empty when ``register`` can go ahead (it then still checks an mltable's content and folder links)."""
    problems = {}
    if problem := names.name_problem("name", name):
        problems["name"] = problem
    if type not in TYPES:
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
        problems["path"] = not_allowed("path", path, f"a regular file (type uri_file: register {target!r} itself)",
                                        problem=f"is a symbolic link to {target!r}")
    elif type == "uri_file" and not path.is_file():
        problems["path"] = not_allowed("path", path, "a single file (type uri_file)", problem="is not a file")
    elif type in ("uri_folder", "mltable") and not path.is_dir():
        problems["path"] = not_allowed("path", path, f"a folder (type {type})", problem="is not a folder")
    elif type == "mltable" and not (path / "MLTable").is_file():
        problems["path"] = not_allowed(
            "path", path, "a folder with an MLTable file describing the table (type mltable)",
            problem="has no MLTable file")
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
        raise DataAssetError(not_allowed(
            "path", folder, "an MLTable whose paths exist and whose columns convert to the declared types",
            problem=f"holds files that do not match its MLTable ({exc})")) from None


# --- the store: blobs, listings, snapshots ----------------------------------------------------------------------


def _tmp_path(folder: Path, stem: str) -> Path:
    return folder / f".{stem}.{uuid.uuid4().hex}{TMP_SUFFIX}"


def _intact(path: Path, sha256: str) -> bool:
    """A regular file in the store whose bytes hash to ``sha256``."""
    try:
        return stat.S_ISREG(path.lstat().st_mode) and sha256_file(path) == sha256
    except FileNotFoundError:
        return False


def _reusable_blob(blob: Path, sha256: str, size: int) -> bool:
    """Whether a registration may link an existing blob instead of storing the bytes again.

    Re-hashing every blob on every registration doubled the time to register content that is already stored, so
    a blob is taken as intact without reading it when its lstat shows what this module leaves: a regular file of
    the expected size with no write permission. That heals what a registration can see cheaply: a blob missing,
    replaced by a link, truncated or grown (the older Trainbook's write through a hard link), or made writable
    (how anyone but root edits one). A blob rewritten in place at the same size with its mode put back, or bit
    rot, is what `data verify` finds: it re-hashes every blob. Any other blob is re-hashed here; an intact one is
    made read-only again (so the next check is cheap), a damaged one is replaced."""
    try:
        found = blob.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(found.st_mode) or found.st_size != size:
        return False
    if not found.st_mode & 0o222:
        return True
    if not _intact(blob, sha256):
        return False
    with contextlib.suppress(PermissionError):  # another user's blob stays as it is, checked by hash each time
        os.chmod(blob, stat.S_IMODE(found.st_mode) & ~0o222)  # metadata only: no byte of any link to it changes
    return True


def _publish_file(dest: Path, data: bytes) -> None:
    """``data`` as the read-only file ``dest``, through a fresh temporary name: a file already at ``dest`` is
    replaced, never opened, so nothing is written through a link to it."""
    tmp = _tmp_path(dest.parent, dest.name)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.chmod(tmp, 0o444)
        os.replace(tmp, dest)  # killed before this line: only a .tmp file is left, never a wrong file
    finally:
        tmp.unlink(missing_ok=True)


def _store_blob(path: Path, blobs: Path) -> str:
    """Copy one file into the content-addressed store; returns its sha256. An unreadable file stops the
    registration before the catalogue is touched (blobs already stored are content-addressed: harmless)."""
    try:
        return _copy_into_store(path, blobs)
    except PermissionError as exc:
        raise DataAssetError(not_allowed(
            "path", path, "readable files", problem=f"cannot be read ({exc.strerror})")) from None


def _copy_into_store(path: Path, blobs: Path) -> str:
    """Copy one file into the content-addressed store; returns its sha256.

    Small files are read once: hashed from memory and written from the same bytes, so the blob is what was
    hashed even if the source changes meanwhile. Large files are hashed while copied, then checked again. A
    blob already stored is reused only if it still looks as it was left (:func:`_reusable_blob`); a damaged one
    is replaced.
    """
    if path.stat().st_size <= SMALL_BLOB_BYTES:
        data = path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        if not _reusable_blob(blobs / digest, digest, len(data)):
            _publish_file(blobs / digest, data)
        return digest
    tmp = _tmp_path(blobs, "blob")
    try:
        with open(tmp, "xb") as dst:
            digest, size = read_hashed(path, dst)
        blob = blobs / digest
        if not _reusable_blob(blob, digest, size):
            if sha256_file(tmp) != digest:
                raise DataAssetError(f"path: {str(path)!r} changed while it was being registered; try again")
            os.chmod(tmp, 0o444)
            os.replace(tmp, blob)
    finally:
        tmp.unlink(missing_ok=True)
    return digest


def _listing_bytes(type: str, listing: list[dict]) -> bytes:
    return json.dumps([type, listing], sort_keys=True).encode()


def content_hash(type: str, listing: list[dict]) -> str:
    """An asset's identity: its type and every file's name, hash and size (a rename is a new version too)."""
    return hashlib.sha256(_listing_bytes(type, listing)).hexdigest()


def _store_listing(ws: Workspace, type: str, listing: list[dict]) -> str:
    """Keep [type, listing] as listings/<content hash>.json (its own bytes hash to its name); returns the hash."""
    data = _listing_bytes(type, listing)
    content = hashlib.sha256(data).hexdigest()
    path = ws.datastore / LISTINGS / f"{content}.json"
    if not _intact(path, content):
        path.parent.mkdir(parents=True, exist_ok=True)
        _publish_file(path, data)
    return content


def _checked_listing(listing) -> list[dict]:
    """A listing read from disk, refused unless every entry is a plain relative name with a hash and a size: a
    copied workspace is untrusted, and a name like '../x' would place a file outside its snapshot."""
    def fine(entry) -> bool:
        return isinstance(entry, dict) and fsio.name_inside(entry.get("name")) and fsio.file_entry_ok(entry)

    if not isinstance(listing, list) or not all(fine(e) for e in listing) or \
            len({e["name"] for e in listing}) != len(listing):
        raise ValueError("not a listing of distinct relative file names with sha256 and size")
    return listing


def _read_listing(path: Path, type: str, content: str, wrapped: bool) -> list[dict] | None:
    """The listing in ``path`` if its bytes are the asset's (content_hash(type, listing) == content), else None.
    ``wrapped``: the file holds [type, listing] (listings/); otherwise a bare listing (an old snapshot's)."""
    try:
        parsed = json.loads(path.read_bytes())
        listing = _checked_listing(parsed[1] if wrapped and parsed[0] == type else None if wrapped else parsed)
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return None
    return listing if content_hash(type, listing) == content else None


def _store_tree(folder: Path) -> dict[str, os.stat_result]:
    """Everything in a store folder that is not a directory (files, links, anything else), never following a
    link: what is physically there, to compare with a listing."""
    found, pending = {}, [("", str(folder))]
    while pending:  # scandir and plain strings: every registration of known content checks its whole snapshot
        prefix, path = pending.pop()
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append((f"{prefix}{entry.name}/", entry.path))
                    else:
                        found[prefix + entry.name] = entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # swapped out by a rebuild while read: what is gone is reported missing
            continue
    return found


def _snapshot_problems(folder: Path, listing: list[dict], blobs: Path) -> list[tuple[str, str]]:
    """(file, what is wrong) for every way a snapshot folder differs from its listing. A file that is a hard link
    to its own blob is taken as intact here: blobs are checked by hash on their own. Any other file is hashed."""
    if not folder.is_dir() or folder.is_symlink():
        return [("", f"the snapshot folder {str(folder)!r} is missing")]
    present = _store_tree(folder)
    expected = {entry["name"]: entry for entry in listing}
    problems = [(name, "is in the snapshot but not in its listing") for name in sorted(present.keys() - expected)]
    for name, entry in expected.items():
        found = present.get(name)
        if found is None:
            problems.append((name, "is missing from the snapshot"))
        elif not stat.S_ISREG(found.st_mode):
            problems.append((name, "is a symbolic link or special file, not the registered file"))
        elif not _same_file(found, blobs / entry["sha256"]) and \
                (found.st_size != entry["size"] or not _intact(folder / name, entry["sha256"])):
            problems.append((name, f"changed: its bytes are not the registered ones (sha256 {entry['sha256']})"))
    return sorted(problems)


def _same_file(found: os.stat_result, blob: Path) -> bool:
    try:
        other = blob.lstat()
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (other.st_dev, other.st_ino)


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:  # links not allowed here: a copy is as good, just bigger ('xb': never onto an existing file)
        with open(src, "rb") as s, open(dest, "xb") as d:
            shutil.copyfileobj(s, d, HASH_CHUNK)
        os.chmod(dest, 0o444)


def _remove(path: Path) -> None:
    """Delete a store entry this module made (a snapshot set aside, a temporary folder), never through a link."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _publish_snapshot(ws: Workspace, content: str, listing: list[dict]) -> Path:
    """snapshots/<content>: the listing's files linked from their (already verified) blobs. An intact snapshot
    is reused; a damaged one (or one made by an older Trainbook) is rebuilt and swapped in."""
    blobs = ws.datastore / BLOBS
    snapshot = ws.datastore / SNAPSHOTS / content
    if not _snapshot_problems(snapshot, listing, blobs):
        return snapshot
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    # One rebuild at a time, checked again under the lock: two processes finding the same damaged (or older)
    # snapshot, say two ranks starting on it, would otherwise each swap one in, and the second would set aside
    # the first one's snapshot while that one's process reads it.
    with _locked(snapshot.parent):
        if _snapshot_problems(snapshot, listing, blobs):
            _rebuild_snapshot(blobs, snapshot, listing)
    return snapshot


@contextlib.contextmanager
def _locked(folder: Path):
    """An exclusive lock on a store folder, held until the block ends (the kernel drops it if the process dies:
    a killed holder never blocks anyone). Nothing is written: the folder is only opened to lock it."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _rebuild_snapshot(blobs: Path, snapshot: Path, listing: list[dict]) -> None:
    """Link the listing's files from their blobs into a fresh folder and swap it in for ``snapshot``."""
    content = snapshot.name
    tmp = _tmp_path(snapshot.parent, content)
    try:
        for entry in listing:
            dest = tmp / entry["name"]
            dest.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(blobs / entry["sha256"], dest)
        if snapshot.exists() or snapshot.is_symlink():
            # Readers holding its files open keep them; for a moment the path is missing, never half-built.
            aside = _tmp_path(snapshot.parent, f"{content}.damaged")
            try:
                os.rename(snapshot, aside)
            except FileNotFoundError:  # another process set it aside first
                pass
            else:
                _remove(aside)
        try:
            os.rename(tmp, snapshot)
        except OSError:  # another process published the same content first: theirs is identical
            pass
    finally:
        if tmp.exists():
            _remove(tmp)


def store_snapshot(ws: Workspace, source: Path, type: str) -> tuple[str, int, int, str]:
    """Content-address ``source`` into the datastore. Returns (sha256, size, file count, snapshot path)."""
    files = [(source.name, source)] if type == "uri_file" else _files_of(source)
    if type == "mltable":
        _check_mltable(source)
    blobs = ws.datastore / BLOBS
    blobs.mkdir(parents=True, exist_ok=True)
    # File I/O releases the GIL: a few threads overlap the many small reads and writes of a folder asset.
    with ThreadPoolExecutor(max_workers=SNAPSHOT_THREADS) as pool:
        digests = list(pool.map(lambda item: _store_blob(item[1], blobs), files))
    listing = [{"name": rel, "sha256": digest, "size": (blobs / digest).stat().st_size}
               for (rel, _), digest in zip(files, digests)]
    content = _store_listing(ws, type, listing)
    snapshot = _publish_snapshot(ws, content, listing)
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
        raise DataAssetError(not_allowed("tags", tags, "a mapping of strings to strings"))
    sha256, size, count, snapshot = store_snapshot(ws, source.resolve(), type)
    with ws.transaction() as conn:
        existing = conn.execute("SELECT * FROM data_assets WHERE name = ? AND sha256 = ? AND type = ? "
                                "ORDER BY version DESC LIMIT 1", (name, sha256, type)).fetchone()
        if existing is not None:
            if existing["snapshot"] != snapshot:  # recorded elsewhere (a damaged row): serve the one just checked
                conn.execute("UPDATE data_assets SET snapshot = ? WHERE name = ? AND version = ?",
                             (snapshot, name, existing["version"]))
                existing = conn.execute("SELECT * FROM data_assets WHERE name = ? AND version = ?",
                                        (name, existing["version"])).fetchone()
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
    return names.parse_ref(ref, "data asset", DataAssetError)


def _row(ws: Workspace, ref: str):
    """The catalogue row of ``name:version`` (archived ones included: old runs stay reproducible) or ``name``
    (latest not archived); refuses an unknown reference, naming the versions that exist."""
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
    listing, found, old_layout = _asset_listing(ws, row)
    if listing is None:
        raise DataAssetError(f"data asset: {row['name']}:{row['version']} cannot be read: {found[0]}")
    folder = _snapshot_folder(ws, row)
    why = "is missing or not a folder" if folder.is_symlink() or not folder.is_dir() else \
        "was made by an older Trainbook" if old_layout or _holds_old_listing(folder, listing) else None
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
    states, _ = _blob_states(ws.datastore / BLOBS, {entry["sha256"] for entry in listing}, progress=True)
    repaired = _repair(ws, row, listing, states)
    if repaired is not None:
        return repaired
    entry = next(entry for entry in listing if states[entry["sha256"]])
    raise DataAssetError(
        f"data asset: {ref} cannot be read: its snapshot {why} and cannot be rebuilt, because the datastore's copy of "
        f"{entry['name']!r} (blob {entry['sha256']}) {states[entry['sha256']]}; nothing was read. "
        f"`trainbook data verify --repair` rebuilds every version it can and names each damaged file; to replace "
        f"the damaged copy, register the source of {ref} again (`trainbook data register {row['name']} "
        f"{row['source']}`)")


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
        raise DataAssetError(not_allowed("data asset", ref, "'name:version' (archive is explicit)",
                                         problem="names no version"))
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
    type = "uri_file" if path.is_file() else "mltable" if (path / "MLTable").is_file() else "uri_folder"
    listing = []
    if hash:  # else only the type is wanted (a check before launch): no need to read the data
        for rel, file in ([(path.name, path)] if type == "uri_file" else _files_of(path)):
            digest, size = read_hashed(file)
            listing.append({"name": rel, "sha256": digest, "size": size})
    return DataAsset(name=path.name, version=0, type=type, sha256=content_hash(type, listing) if hash else "",
                     size_bytes=sum(e["size"] for e in listing), file_count=len(listing), created=path.stat().st_mtime,
                     source=str(path), description="", tags={}, archived=False, path=path, listing=tuple(listing))


def asset_files(asset: DataAsset) -> list[tuple[str, Path]]:
    """(name in the listing, path) of every file of an asset, in content-hash order. A registered version's come
    from its listing (:func:`open_asset` attaches it), never from walking its snapshot: nothing but the registered
    files is read, whatever else the folder holds. A file or folder opened in place is walked by the
    registration's rule."""
    if not asset.version:
        return [(asset.path.name, asset.path)] if asset.type == "uri_file" else _files_of(asset.path)
    if not asset.listing:
        raise DataAssetError(f"data asset: {asset.ref} was looked up without its listing; read a registered "
                             "version through data_assets.open_asset")
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
        raise DataAssetError(f"data: {str(path)!r} of {asset.ref} {state}; nothing was read; `trainbook data verify "
                             f"{asset.ref}` names the damage and `trainbook data verify --repair` rebuilds the "
                             "snapshot from intact blobs")
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
                        "`trainbook data verify --repair` rebuilds the snapshot from intact blobs")
                state = "appeared" if name not in hashed else "disappeared" if name not in read else "changed"
                raise DataAssetError(not_allowed(
                    "data", file, "data that stays the same while a run reads it (start the run again to hash the "
                                  "new content)",
                    problem=f"{state} after it was hashed for {where}; nothing was cached"))
    if content_hash(asset.type, listing) == asset.sha256:
        return
    if asset.version:  # unreachable through open_asset (its listing hashes to the registration): a backstop
        raise DataAssetError(f"data: the files of {where} at {str(asset.path)!r} are not the bytes it was registered "
                             f"with; nothing was cached; `trainbook data verify {asset.ref}` names the file")
    raise DataAssetError(refused("data", f"the files of {where} changed after they were hashed; nothing was cached",
                                 "data that stays the same while a run reads it"))


# --- verify -------------------------------------------------------------------------------------------------------


@dataclass
class Problem:
    asset: str | None  # name:version, or None for the store itself
    file: str | None  # the file inside the asset, or the entry of the store
    message: str

    def __str__(self) -> str:
        where = " ".join(x for x in (self.asset, self.file and repr(self.file)) if x)
        return f"{where}: {self.message}" if where else self.message


@dataclass
class VerifyReport:
    assets: list[str]  # the versions checked
    blobs: int  # blobs re-hashed
    bytes: int
    problems: list[Problem] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)  # '.tmp' entries of interrupted registrations
    repaired: list[str] = field(default_factory=list)  # versions whose snapshot was rebuilt from their blobs

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = (f"checked {len(self.assets)} asset version(s) and {self.blobs} blob(s) ({self.bytes:,} bytes): "
                + (f"{len(self.problems)} problem(s)" if self.problems else "no problems"))
        lines = [head, *(f"  {p}" for p in self.problems)]
        if self.repaired:
            lines.append(f"repaired (snapshot rebuilt from intact blobs): {', '.join(self.repaired)}")
        if self.leftovers:
            lines.append(f"{len(self.leftovers)} '.tmp' leftover(s) of interrupted registrations: harmless, safe to "
                         "delete")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def _rows_to_verify(ws: Workspace, ref: str | None) -> list:
    """Every version (archived too), every version of NAME, or NAME:VERSION."""
    query, args = "SELECT * FROM data_assets", ()
    if ref is not None:
        name, version = parse_ref(ref)
        query, args = (query + " WHERE name = ?", (name,)) if version is None else \
            (query + " WHERE name = ? AND version = ?", (name, version))
    conn = ws.connect()
    try:
        rows = conn.execute(query + " ORDER BY name, version", args).fetchall()
    finally:
        conn.close()
    if ref is not None and not rows:
        get(ws, ref)  # refuses the reference, naming the versions that exist
    return rows


def _asset_listing(ws: Workspace, row) -> tuple[list[dict] | None, list[str], bool]:
    """A version's listing, what is wrong with it, and whether it was found inside the snapshot folder (where
    an older Trainbook kept it) rather than in listings/."""
    content, type = row["sha256"], row["type"]
    if not SHA256_RE.fullmatch(content):
        return None, [f"its content hash {content!r} is not a sha256; the catalogue row is damaged"], False
    current, inside = ws.datastore / LISTINGS / f"{content}.json", _snapshot_folder(ws, row) / OLD_LISTING
    listing = _read_listing(current, type, content, wrapped=True)
    old = None if listing is not None else _read_listing(inside, type, content, wrapped=False)
    if listing is None and old is None:  # looked again: a rebuild stores the listing, then swaps out the old one
        listing = _read_listing(current, type, content, wrapped=True)
    if listing is not None:
        return listing, [], False
    if old is not None:
        return old, ["made by an older Trainbook: its listing is kept inside the snapshot folder, so the folder is "
                     "not exactly the registered files; `trainbook data verify --repair` rebuilds it"], True
    return None, [f"no listing in {LISTINGS}/ (nor an older Trainbook's {OLD_LISTING} in its snapshot) hashes to "
                  f"{content}: its files cannot be checked; register its source again"], False


def _snapshot_folder(ws: Workspace, row) -> Path:
    path = ws.root / row["snapshot"]
    return path.parent if row["type"] == "uri_file" else path


def _blob_states(blobs: Path, names: set[str], progress: bool) -> tuple[dict[str, str | None], int]:
    """({blob: None if its bytes hash to its name, else what is wrong}, bytes hashed), with a progress bar on
    large stores."""
    from tqdm import tqdm

    sizes = {name: (blobs / name).lstat().st_size if (blobs / name).is_file() else 0 for name in names}

    def check(name: str) -> tuple[str, str | None]:
        path = blobs / name
        if path.is_symlink():
            return name, "is a link, not a file"
        if not path.is_file():
            return name, "is missing from the blob store"
        return name, None if sha256_file(path) == name else "no longer hashes to its name: its bytes changed"

    states = {}
    with tqdm(total=sum(sizes.values()), unit="B", unit_scale=True, desc="verify", delay=2.0,
              disable=not progress, leave=False) as bar, ThreadPoolExecutor(max_workers=SNAPSHOT_THREADS) as pool:
        for name, state in pool.map(check, sorted(names)):
            states[name] = state
            bar.update(sizes[name])
    return states, sum(sizes.values())


def _store_entries(ws: Workspace) -> tuple[set[str], list[Problem], list[str]]:
    """(blob names, unexpected entries, '.tmp' leftovers) of the whole datastore."""
    patterns = {BLOBS: SHA256_RE, LISTINGS: re.compile(r"[0-9a-f]{64}\.json"), SNAPSHOTS: SHA256_RE}
    blobs, odd, leftovers = set(), [], []
    for kind, pattern in patterns.items():
        folder = ws.datastore / kind
        for name in sorted(os.listdir(folder)) if folder.is_dir() else []:
            if name.endswith(TMP_SUFFIX):
                leftovers.append(f"{kind}/{name}")
            elif not pattern.fullmatch(name):
                odd.append(Problem(None, f"{kind}/{name}", "unexpected entry in the datastore"))
            elif kind == BLOBS:
                blobs.add(name)
    return blobs, odd, leftovers


def verify(ws: Workspace, ref: str | None = None, repair: bool = False, progress: bool = False) -> VerifyReport:
    """Re-hash every blob (its bytes must hash to its name) and check each asset version's snapshot against its
    listing: files missing, extra, changed, or not linked to the right blob. ``ref``: NAME (every version) or
    NAME:VERSION; default the whole datastore. ``repair`` rebuilds the snapshots of versions whose listing and
    blobs are intact (those of older Trainbooks, or damaged); a damaged blob needs its source registered again."""
    rows = _rows_to_verify(ws, ref)
    listings = {(row["name"], row["version"]): _asset_listing(ws, row) for row in rows}
    used = {entry["sha256"] for listing, _, _ in listings.values() for entry in listing or []}
    stored, problems, leftovers = _store_entries(ws) if ref is None else (set(), [], [])
    states, hashed = _blob_states(ws.datastore / BLOBS, stored | used, progress)
    problems += [Problem(None, f"{BLOBS}/{name}", state) for name, state in sorted(states.items())
                 if state and name not in used]  # a damaged blob no version uses (a model's, or an orphan)
    report = VerifyReport([f"{row['name']}:{row['version']}" for row in rows], len(states), hashed,
                          leftovers=leftovers)
    for row in rows:
        listing, found, old_layout = listings[(row["name"], row["version"])]
        asset_problems = _version_problems(ws, row, listing, found, old_layout, states)
        repaired = _repair(ws, row, listing, states) if asset_problems and repair else None
        if repaired is not None:
            asset_problems = _version_problems(ws, repaired, listing, [], False, states)
            if not asset_problems:
                report.repaired.append(f"{row['name']}:{row['version']}")
        problems += asset_problems
    report.problems = problems
    return report


def _version_problems(ws: Workspace, row, listing: list[dict] | None, found: list[str], old_layout: bool,
                      states: dict[str, str | None]) -> list[Problem]:
    ref = f"{row['name']}:{row['version']}"
    problems = [Problem(ref, None, message) for message in found]
    if listing is None:
        return problems
    if (row["file_count"], row["size_bytes"]) != (len(listing), sum(e["size"] for e in listing)):
        problems.append(Problem(ref, None, f"the catalogue says {row['file_count']} file(s), {row['size_bytes']:,} "
                                           "bytes; its listing disagrees"))
    folder = _snapshot_folder(ws, row)
    if folder.resolve() != (ws.datastore / SNAPSHOTS / row["sha256"]).resolve():
        problems.append(Problem(ref, None, f"its snapshot {row['snapshot']!r} is not {SNAPSHOTS}/{row['sha256']}"))
    for entry in listing:
        state = states.get(entry["sha256"])
        if state:
            problems.append(Problem(ref, entry["name"], f"its blob {entry['sha256']} {state}; register its source "
                                                        "again (that replaces the blob)"))
    for name, message in _snapshot_problems(folder, listing, ws.datastore / BLOBS):
        if old_layout and name == OLD_LISTING and not any(e["name"] == OLD_LISTING for e in listing):
            message += " (the older Trainbook's own listing)"
        problems.append(Problem(ref, name or None, message))
    return problems


def _repair(ws: Workspace, row, listing: list[dict] | None, states: dict[str, str | None]):
    """Rebuild a version's snapshot (and its listing file) from its blobs if every one of them is intact;
    returns the version's catalogue row as it is now, or None when it cannot be repaired."""
    if listing is None or any(states.get(e["sha256"]) for e in listing):
        return None
    content = _store_listing(ws, row["type"], listing)
    snapshot = _publish_snapshot(ws, content, listing)
    os.sync()
    rel = snapshot.relative_to(ws.root).as_posix() + ("/" + listing[0]["name"] if row["type"] == "uri_file" else "")
    with ws.transaction() as conn:
        conn.execute("UPDATE data_assets SET snapshot = ? WHERE name = ? AND version = ?",
                     (rel, row["name"], row["version"]))
        return conn.execute("SELECT * FROM data_assets WHERE name = ? AND version = ?",
                            (row["name"], row["version"])).fetchone()
