"""What an exported model folder is, and how one is published.

    read_manifest(folder)          the manifest, checked to be a Trainbook model's (cheap: one small file)
    verify_model_folder(folder)    every byte against the manifest: what a server loads must be what was exported
    check_replaceable(out, ...)    may a folder be written at ``out``: missing, empty, or an earlier one of its kind
    staging_folder(out)            a hidden, locked folder beside ``out`` to assemble the new one in
    publish_folder(tmp, out, ...)  fsync it, then swap it in at ``out`` in one step

Kept apart from :mod:`toolkit.export` (which imports torch) so that servers, planners and registries can read
and check model folders without paying for torch. The publishing half is not specific to models: a plan folder
follows the same rule (a marker file says what a folder is) and can be published the same way.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from toolkit.checkpoint_store import fsync_path, sha256_file

MANIFEST = "trainbook-model.json"
FORMAT = "trainbook-model-v1"
WHAT = "a folder written by `trainbook export RUN_DIR`"
SHA256_RE = re.compile(r"[0-9a-f]{64}")


class ExportError(ValueError):
    """A run cannot be exported, or a folder is not an export; the message names what is missing."""


def read_manifest(model_dir: str | Path) -> dict:
    """The manifest of an exported model folder, checked to be one (its files are not read: see
    :func:`verify_model_folder`)."""
    path = Path(model_dir) / MANIFEST
    if not path.is_file():
        raise ExportError(f"model: {str(model_dir)!r} is not an exported model folder (no {MANIFEST}); allowed: "
                          f"{WHAT}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ExportError(f"model: {str(path)!r} cannot be read ({exc}); allowed: the manifest the export wrote "
                          "(export again)") from None
    if not isinstance(manifest, dict):
        raise ExportError(f"model: {str(path)!r} holds a {type(manifest).__name__}, not an object; allowed: the "
                          "manifest the export wrote (export again)")
    if manifest.get("format") != FORMAT:
        raise ExportError(f"model: {str(model_dir)!r} has format {manifest.get('format')!r}; allowed: {FORMAT}")
    return manifest


# --- verification: what is served is what was exported -----------------------------------------------------------

def _plain_name(name) -> bool:
    """A file directly in the folder: no separator, no '..', not hidden (a listed name never leaves the folder)."""
    return (isinstance(name, str) and name not in ("", ".", "..") and not name.startswith(".")
            and "/" not in name and "\\" not in name and "\0" not in name)


def _entry_ok(info) -> bool:
    size = info.get("size") if isinstance(info, dict) else None
    return (isinstance(size, int) and not isinstance(size, bool) and size >= 0
            and isinstance(info.get("sha256"), str) and bool(SHA256_RE.fullmatch(info["sha256"])))


def listed_files(manifest: dict, where: str) -> dict[str, dict]:
    """The manifest's ``files``: plain name -> {"size", "sha256"}; anything else is refused, naming ``where``."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ExportError(f"model: files {files!r} in {where} is not allowed; allowed: an object naming every file "
                          "of the folder with its size and sha256 (export again)")
    for name, info in files.items():
        if not _plain_name(name):
            raise ExportError(f"model: {where} lists {name!r}; allowed: plain file names inside the folder (no '/', "
                              "'..' or leading '.')")
        if not _entry_ok(info):
            raise ExportError(f"model: {where} lists {name!r} as {info!r}; allowed: {{\"size\": bytes, \"sha256\": "
                              "64 hex digits}")
    return files


def _check_entries(folder: Path, files: dict) -> None:
    """No link anywhere, every listed name a regular file, nothing unlisted a runtime could pick up. Hidden names
    are left alone: runtimes load fixed, listed names, and a registry may keep its own metadata there."""
    for entry in os.scandir(folder):
        if entry.is_symlink():
            raise ExportError(f"model: {str(folder)!r} holds {entry.name}, a symbolic link; allowed: regular files "
                              "only (a link would serve bytes from outside the folder)")
        if entry.name in files and not entry.is_file(follow_symlinks=False):
            raise ExportError(f"model: {str(folder)!r} holds {entry.name}, listed in {MANIFEST}, which is not a "
                              "regular file; allowed: the files as exported (export again)")
        if entry.name not in files and entry.name != MANIFEST and not entry.name.startswith("."):
            raise ExportError(f"model: {str(folder)!r} holds {entry.name}, which {MANIFEST} does not list; allowed: "
                              "only the exported files (remove it, or export again)")
    missing = sorted(name for name in files if not (folder / name).is_file())
    if missing:
        raise ExportError(f"model: {str(folder)!r} lacks {', '.join(missing)}, listed in {MANIFEST}; allowed: a "
                          "complete export (export again)")


def verify_model_folder(model_dir: str | Path) -> dict:
    """The manifest of ``model_dir`` once every file it lists has its size and sha256 (sizes first: a torn copy
    fails before any hashing). Refuses links, listed names that leave the folder and unlisted files, naming the
    file. Costs one read of the folder: sha256 runs at ~1.8 GB/s here."""
    folder = Path(model_dir)
    manifest = read_manifest(folder)
    files = listed_files(manifest, repr(str(folder / MANIFEST)))
    _check_entries(folder, files)
    for name, info in files.items():
        size = (folder / name).stat().st_size
        if size != info["size"]:
            raise ExportError(f"model: {str(folder)!r} has {name} of {size} bytes, {MANIFEST} lists {info['size']}; "
                              "allowed: the files as exported (export again)")
    for name, info in files.items():
        if sha256_file(folder / name) != info["sha256"]:
            raise ExportError(f"model: {str(folder)!r} has {name} whose sha256 differs from {MANIFEST}: it was "
                              "changed after the export; allowed: the files as exported (export again)")
    return manifest


# --- publishing: which folder may be replaced, and replacing it in one step --------------------------------------

def check_replaceable(out: Path, *, marker: str = MANIFEST, kind: str = "model", field: str = "--out",
                      error: type[Exception] = ExportError) -> None:
    """``out`` may be written: it is missing, an empty folder, or an earlier ``kind`` folder (it holds ``marker``
    as a regular file); never a link, a file or someone else's folder (replacing deletes what is there)."""
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise error(f"{field}: {str(out)!r} is a symbolic link; allowed: a real folder path (a link is never "
                    "written through or replaced)")
    if stat.S_ISDIR(mode):
        with os.scandir(out) as entries:
            names = {entry.name: entry for entry in entries}
        if not names or (marker in names and names[marker].is_file(follow_symlinks=False)):
            return
    raise error(f"{field}: {str(out)!r} exists and is not a {kind} folder; allowed: a new or empty folder, or an "
                f"earlier {kind} folder (it holds {marker}; it is replaced)")


def _staging_names(out: Path) -> re.Pattern:
    # .NAME.<hex>.tmp: being assembled (or, after a swap, the previous folder being removed); .NAME.<hex>.old:
    # what exports before the one-step swap left when killed between their two renames.
    return re.compile(re.escape(f".{out.name}.") + r"[0-9a-f]{8,32}\.(tmp|old)")


def _lock(folder: Path) -> int | None:
    """An fd holding an exclusive lock on ``folder``, or None if another process holds it. The kernel drops the
    lock when its holder dies, however it dies: an unlocked staging folder belongs to nobody."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def remove_stale_staging(out: Path) -> list[str]:
    """Remove the staging folders that killed publishers of ``out`` left (hidden names, nobody holds their lock);
    returns their names. Only our own names, only real folders: never a link, never anything else."""
    pattern, removed = _staging_names(out), []
    if not out.parent.is_dir():
        return removed
    for entry in os.scandir(out.parent):
        if not (pattern.fullmatch(entry.name) and entry.is_dir(follow_symlinks=False)):
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to open: leave it
            fd = _lock(Path(entry.path))
            if fd is None:
                continue  # a live publisher is assembling it
            try:
                shutil.rmtree(entry.path)
                removed.append(entry.name)
            finally:
                os.close(fd)
    return removed


@contextlib.contextmanager
def staging_folder(out: Path):
    """A new hidden folder beside ``out`` (same filesystem, so it can be swapped in), locked while this process
    assembles it, and gone when the block ends: published by :func:`publish_folder`, or removed. Stale ones of
    killed publishers are removed first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out)
    tmp, fd = _new_locked_folder(out)
    try:
        yield tmp
    finally:  # published: the name is gone or holds what was replaced; not published: the work is dropped
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def _new_locked_folder(out: Path) -> tuple[Path, int]:
    import fcntl

    for _ in range(100):
        tmp = out.parent / f".{out.name}.{uuid.uuid4().hex[:16]}.tmp"
        tmp.mkdir()
        try:
            fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except FileNotFoundError:
            continue  # a cleaner took it for stale in the instant before we opened it: take another name
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(FileNotFoundError):
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                return tmp, fd  # locked, and still the folder at that name
        os.close(fd)
    raise OSError(f"{out.parent}: cannot make a staging folder that stays (other processes keep removing them)")


def fsync_tree(folder: Path) -> None:
    """Every file in ``folder`` and the folder itself on disk: after the swap, a power cut cannot leave a
    published folder whose names are there and whose bytes are not."""
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            fsync_path(Path(entry.path))
    fsync_path(folder)


RENAME_EXCHANGE = 2  # <linux/fs.h>
AT_FDCWD = -100


def exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2 RENAME_EXCHANGE: no moment where either is missing).
    False where libc, the kernel or the filesystem cannot; other failures raise."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)  # glibc 2.28+; absent on macOS and older C libraries
    if renameat2 is None:
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # no syscall, or a filesystem without the flag
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def replace_in_two_steps(new: Path, dest: Path) -> Path:
    """The fallback where :func:`exchange` is unavailable: move ``dest`` aside, then ``new`` in. Between the two
    renames (microseconds) ``dest`` is missing; a crash there leaves the previous folder complete under a hidden
    ``.NAME.<hex>.old`` and the new one under its staging name. Returns where the previous folder went."""
    old = dest.with_name(f".{dest.name}.{uuid.uuid4().hex[:16]}.old")
    os.rename(dest, old)
    try:
        os.rename(new, dest)
    except BaseException:
        os.rename(old, dest)  # the previous folder goes back rather than stay hidden
        raise
    return old


def swap_in(new: Path, dest: Path) -> Path | None:
    """Put the folder ``new`` at ``dest`` in one step; returns the path now holding the previous ``dest`` (to
    remove), or None if there was none. FileExistsError: ``dest`` was missing and something appeared there first
    (check it again before swapping it out)."""
    if not os.path.lexists(dest):
        try:
            os.rename(new, dest)  # atomic; fails if a folder with content appeared there meanwhile
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise FileExistsError(exc.errno, f"{dest} appeared while {new} was published") from None
            raise
        return None
    if exchange(new, dest):
        return new
    return replace_in_two_steps(new, dest)


def publish_folder(tmp: Path, out: Path, *, marker: str = MANIFEST, kind: str = "model", field: str = "--out",
                   error: type[Exception] = ExportError) -> None:
    """Make the assembled folder ``tmp`` (from :func:`staging_folder`) the folder ``out``: fsync every file and
    the folder, check once more that ``out`` may be replaced (it may have changed during the work), swap in one
    step, fsync the parent (the swap itself is durable), then remove the previous folder."""
    fsync_tree(tmp)
    rule = {"marker": marker, "kind": kind, "field": field, "error": error}
    check_replaceable(out, **rule)
    try:
        previous = swap_in(tmp, out)
    except FileExistsError:  # a concurrent publisher put its folder there between the check and the rename
        check_replaceable(out, **rule)
        previous = swap_in(tmp, out)
    fsync_path(out.parent)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
