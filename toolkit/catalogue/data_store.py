"""The datastore: content-addressed blobs, the listings that name an asset's files, and the snapshot folders
built from them. It stores and checks bytes; which name and version a content has is the catalogue's
(:mod:`toolkit.catalogue.data_assets`), and checking a whole workspace is :mod:`toolkit.catalogue.data_verify`'s.

This module owns the datastore's layout:

    datastore/
      blobs/<sha256>              each distinct file once, read-only; its name is the sha256 of its bytes
      listings/<content>.json     an asset's [type, listing]; the sha256 of these bytes is its content hash
      snapshots/<content>/        exactly the user's files (hard links to their blobs), nothing else

Every file is written under a '.tmp' name and renamed into place: nothing in the store is ever opened for
writing, so no write can reach a blob through one of its links, and a killed registration leaves only '.tmp'
leftovers. A snapshot holds the user's files and nothing else, so a job reading it in place (Azure ML mounts the
uploaded snapshot) hashes it to the registered asset. Older Trainbooks kept the listing inside the snapshot
(``.listing.json``, OLD_LISTING): :func:`version_listing` still accepts it if it hashes to the registered
content, so such a snapshot can be rebuilt in the current layout.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from toolkit import fsio
from toolkit.errors import UserError, not_allowed
from toolkit.fsio import HASH_CHUNK, sha256_file
from toolkit.catalogue.workspace import Workspace

SHA256_RE = fsio.SHA256_RE
SMALL_BLOB_BYTES = 1 << 20
SNAPSHOT_THREADS = 4
BLOBS, LISTINGS, SNAPSHOTS = "blobs", "listings", "snapshots"
TMP_SUFFIX = ".tmp"  # the only names a killed registration leaves behind; harmless, safe to delete
OLD_LISTING = ".listing.json"  # where Trainbook before the listings/ folder kept a listing: inside the snapshot


class DataAssetError(UserError, ValueError):
    """A registration or reference that cannot be honoured; the message names the field and what is allowed.
    Defined here, below the catalogue, because storing a source can already refuse it (a file that cannot be
    read, or changes while it is stored); outside the catalogue it is taken from
    :mod:`toolkit.catalogue.data_assets`."""


def files_of(path: Path, type: str) -> list[tuple[str, Path]]:
    """(relative name, path) of every file of a source of ``type``: a uri_file is its one file; a folder is every
    file under it. THE rule for which files make up an asset, at registration and when a file or folder (a
    snapshot, say) is read in place. Every file counts, dot-files too: a snapshot holds nothing but the user's
    files. A symbolic link is taken as the file it points to (the path given is that file's) if that lies inside
    the folder; one pointing outside is refused, never followed. A FIFO, socket or device is refused (a reader
    would block on it, or read without end), and so is a name a listing cannot hold (a backslash, say). The order
    is the content hash's."""
    if type == "uri_file":
        return [(path.name, path)]
    if not path.is_dir():  # a FIFO, socket or device given as the whole source: neither a file nor a folder
        what = fsio.FILE_TYPES.get(stat.S_IFMT(path.stat().st_mode), "not a regular file") if path.exists() else None
        raise DataAssetError(not_allowed("path", path, "a regular file or a folder", problem=f"is {what or 'missing'}"))
    root = path.resolve()
    files = []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if not fsio.name_inside(rel):
            raise DataAssetError(
                not_allowed("path", p, "file names without a backslash or NUL", problem="cannot be listed by its name")
            )
        file = p
        if p.is_symlink():
            file = p.resolve()
            if not file.is_relative_to(root):
                raise DataAssetError(
                    not_allowed(
                        "path",
                        p,
                        "links to files inside the registered folder",
                        problem=f"is a link to {str(file)!r}, outside {str(root)!r}",
                    )
                )
        if file.is_dir():
            continue
        if not file.is_file():
            try:
                what = fsio.FILE_TYPES.get(stat.S_IFMT(file.stat().st_mode), "not a regular file")
            except FileNotFoundError:
                what = "a link to a file that does not exist"
            raise DataAssetError(not_allowed("path", p, "regular files and folders", problem=f"is {what}"))
        files.append((rel, file))
    if not files:
        raise DataAssetError(not_allowed("path", path, "a folder with at least one file", problem="is an empty folder"))
    return files


def _tmp_path(folder: Path, stem: str) -> Path:
    return folder / f".{stem}.{uuid.uuid4().hex}{TMP_SUFFIX}"


def _intact(path: Path, sha256: str) -> bool:
    """A regular file in the store whose bytes hash to ``sha256``."""
    try:
        return stat.S_ISREG(path.lstat().st_mode) and sha256_file(path) == sha256
    except FileNotFoundError:
        return False


def _reusable_blob(blob: Path, sha256: str, size: int) -> bool:
    """Whether a registration may keep the blob already stored for ``sha256`` instead of writing the bytes again:
    a regular file of that size whose bytes hash to it. Its bytes are always read: a blob rewritten in place
    through one of its hard links (inside the store or out), its size and read-only mode kept, looks intact to
    lstat. An intact blob left writable is made read-only again; a damaged one is replaced by the caller (a fresh
    file swapped in, never written in place)."""
    try:
        found = blob.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(found.st_mode) or found.st_size != size or not _intact(blob, sha256):
        return False
    if found.st_mode & 0o222:
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


def _store_blob(path: Path, blobs: Path, root: Path) -> str:
    """Copy one file into the content-addressed store; returns its sha256. An unreadable file stops the
    registration before the catalogue is touched (blobs already stored are content-addressed: harmless)."""
    try:
        return _copy_into_store(path, blobs, root=root)
    except PermissionError as exc:
        raise DataAssetError(
            not_allowed("path", path, "readable files", problem=f"cannot be read ({exc.strerror})")
        ) from None


def _copy_into_store(path: Path, blobs: Path, expected: str | None = None, root: Path | None = None) -> str:
    """Copy one file into the content-addressed store; returns its sha256. ``expected``: store it only if it hashes
    to that (a blob restored from its source); the sha256 found is returned either way. ``root``: the folder being
    registered, which the file must still lie in when it is opened (:func:`toolkit.fsio.open_inside`: a file
    swapped for a link since :func:`files_of` checked it is refused, never read).

    Small files are read once: hashed from memory and written from the same bytes, so the blob is what was
    hashed even if the source changes meanwhile. Large files are hashed while copied, then checked again. A
    blob already stored is reused only if its bytes still hash to its name (:func:`_reusable_blob`); a damaged
    one is replaced.
    """
    with fsio.open_inside(path, root, field="path", error=DataAssetError) as source:
        if os.fstat(source.fileno()).st_size <= SMALL_BLOB_BYTES:
            data = source.read()
            digest = hashlib.sha256(data).hexdigest()
            if expected in (None, digest) and not _reusable_blob(blobs / digest, digest, len(data)):
                _publish_file(blobs / digest, data)
            return digest
        tmp = _tmp_path(blobs, "blob")
        try:
            with open(tmp, "xb") as dst:
                digest, size = fsio.hash_stream(source, dst)
            blob = blobs / digest
            if expected in (None, digest) and not _reusable_blob(blob, digest, size):
                if sha256_file(tmp) != digest:
                    raise DataAssetError(f"path: {str(path)!r} changed while it was being registered; try again")
                os.chmod(tmp, 0o444)
                os.replace(tmp, blob)
        finally:
            tmp.unlink(missing_ok=True)
        return digest


def restore_blob(ws: Workspace, sha256: str, source: Path) -> str | None:
    """Store ``source`` again as the blob ``sha256`` if its bytes still hash to that: a damaged blob is replaced by
    a fresh file (a link to the old one, in a snapshot or outside the store, keeps the old bytes; a rebuild of the
    snapshot links the new one). Returns None when restored, else why the source could not restore it."""
    ws.require_writable()
    if not source.exists():
        return "is missing"
    if not source.is_file():
        return "is not a regular file"
    try:
        # followed if a link (a registered folder may link to its own files): only bytes hashing to ``sha256`` are
        # ever stored, wherever they come from
        digest = _copy_into_store(source.resolve(), ws.datastore / BLOBS, expected=sha256)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    except DataAssetError:
        return "changed while it was read"
    return None if digest == sha256 else "no longer holds the registered bytes"


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

    if (
        not isinstance(listing, list)
        or not all(fine(e) for e in listing)
        or len({e["name"] for e in listing}) != len(listing)
    ):
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


def snapshot_problems(folder: Path, listing: list[dict], blobs: Path) -> list[tuple[str, str]]:
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
        elif not _same_file(found, blobs / entry["sha256"]) and (
            found.st_size != entry["size"] or not _intact(folder / name, entry["sha256"])
        ):
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
    if not snapshot_problems(snapshot, listing, blobs):
        return snapshot
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    # One rebuild at a time, checked again under the lock: two processes finding the same damaged (or older)
    # snapshot, say two ranks starting on it, would otherwise each swap one in, and the second would set aside
    # the first one's snapshot while that one's process reads it.
    with _locked(snapshot.parent):
        if snapshot_problems(snapshot, listing, blobs):
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


def store_snapshot(ws: Workspace, files: list[tuple[str, Path]], type: str, root: Path) -> tuple[str, int, int, str]:
    """Content-address ``files`` (a source's, as :func:`files_of` lists them) into the datastore as an asset of
    ``type``. ``root``: the resolved folder they were listed from, which each must still lie in when read.
    Returns (sha256, size, file count, snapshot path relative to the workspace)."""
    ws.require_writable()  # before the first blob, not at the catalogue's turn
    blobs = ws.datastore / BLOBS
    blobs.mkdir(parents=True, exist_ok=True)
    # File I/O releases the GIL: a few threads overlap the many small reads and writes of a folder asset.
    with ThreadPoolExecutor(max_workers=SNAPSHOT_THREADS) as pool:
        digests = list(pool.map(lambda item: _store_blob(item[1], blobs, root), files))
    listing = [
        {"name": rel, "sha256": digest, "size": (blobs / digest).stat().st_size}
        for (rel, _), digest in zip(files, digests)
    ]
    content, rel_snapshot = publish(ws, type, listing)
    return content, sum(e["size"] for e in listing), len(listing), rel_snapshot


def publish(ws: Workspace, type: str, listing: list[dict]) -> tuple[str, str]:
    """Keep ``listing`` (its blobs already stored and verified) and link its snapshot; returns (content hash,
    the snapshot's path relative to the workspace: the file itself for a uri_file)."""
    ws.require_writable()
    content = _store_listing(ws, type, listing)
    snapshot = _publish_snapshot(ws, content, listing)
    os.sync()  # one flush for all new blobs and links before the catalogue commits (fsync per file: ~10x slower)
    rel_snapshot = snapshot.relative_to(ws.root).as_posix()
    if type == "uri_file":
        rel_snapshot += "/" + listing[0]["name"]
    return content, rel_snapshot


def version_listing(ws: Workspace, row) -> tuple[list[dict] | None, list[str], bool]:
    """A catalogue row's listing, what is wrong with it, and whether it was found inside the snapshot folder
    (where an older Trainbook kept it) rather than in listings/."""
    content, type = row["sha256"], row["type"]
    if not SHA256_RE.fullmatch(content):
        return None, [f"its content hash {content!r} is not a sha256; the catalogue row is damaged"], False
    current, inside = ws.datastore / LISTINGS / f"{content}.json", snapshot_folder(ws, row) / OLD_LISTING
    listing = _read_listing(current, type, content, wrapped=True)
    old = None if listing is not None else _read_listing(inside, type, content, wrapped=False)
    if listing is None and old is None:  # looked again: a rebuild stores the listing, then swaps out the old one
        listing = _read_listing(current, type, content, wrapped=True)
    if listing is not None:
        return listing, [], False
    if old is not None:
        return (
            old,
            [
                "made by an older Trainbook: its listing is kept inside the snapshot folder, so the folder is "
                "not exactly the registered files; `trainbook data verify --repair` rebuilds it"
            ],
            True,
        )
    return (
        None,
        [
            f"no listing in {LISTINGS}/ (nor an older Trainbook's {OLD_LISTING} in its snapshot) hashes to "
            f"{content}: its files cannot be checked; register its source again"
        ],
        False,
    )


def snapshot_folder(ws: Workspace, row) -> Path:
    """The folder of a catalogue row's snapshot (a uri_file's: the folder holding its one file)."""
    path = ws.root / row["snapshot"]
    return path.parent if row["type"] == "uri_file" else path


def blob_states(ws: Workspace, names: set[str], progress: bool) -> tuple[dict[str, str | None], int]:
    """({blob: None if its bytes hash to its name, else what is wrong}, bytes hashed), with a progress bar on
    large stores."""
    from tqdm import tqdm

    blobs = ws.datastore / BLOBS
    sizes = {name: (blobs / name).lstat().st_size if (blobs / name).is_file() else 0 for name in names}

    def check(name: str) -> tuple[str, str | None]:
        path = blobs / name
        if path.is_symlink():
            return name, "is a link, not a file"
        if not path.is_file():
            return name, "is missing from the blob store"
        return name, None if sha256_file(path) == name else "no longer hashes to its name: its bytes changed"

    states = {}
    with (
        tqdm(
            total=sum(sizes.values()),
            unit="B",
            unit_scale=True,
            desc="verify",
            delay=2.0,
            disable=not progress,
            leave=False,
        ) as bar,
        ThreadPoolExecutor(max_workers=SNAPSHOT_THREADS) as pool,
    ):
        for name, state in pool.map(check, sorted(names)):
            states[name] = state
            bar.update(sizes[name])
    return states, sum(sizes.values())
