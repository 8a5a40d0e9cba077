"""Atomic file and folder writes: the one owner of "readers see the old bytes or the new, never half, never none".

    atomic_write_text(path, text)         a file replaced in one rename, fsynced first
    atomic_files(paths)                   several files written under temporary names, renamed in order at the end
    fsync_path(path)                      a file's or folder's bytes and names on disk
    read_regular_file(path, ...)          the bytes of a file from an untrusted folder: never through a link, never
                                          waiting on a FIFO (open_regular_file: the same, opened to read in pieces)
    open_inside(path, root, ...)          a file of a folder being copied, opened as it was checked: a regular file,
                                          still inside the folder
    check_plain_folder(folder, ...)       a model or tokenizer folder from elsewhere, before a library reads it:
                                          regular files and plain subfolders only (no link, FIFO or device)
    check_replaceable(out, marker, ...)   may a folder be written at ``out``: missing, empty, or an earlier one of
                                          its kind (it holds ``marker``); never a link
    staging_folder(out)                   a hidden, locked folder beside ``out`` to assemble the new one in
    publish_folder(tmp, out, ...)         fsync it, then swap it in at ``out`` in one step

A folder of a kind is recognised by its marker file (an export's manifest, a plan's job.yaml): replacing deletes
what is there, so only a folder that says it is one of ours is ever replaced. Standard library only, and the
heavier modules (ctypes, fcntl) are imported where used: servers, planners and the trainer all call this.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import stat
import tempfile
import uuid
from pathlib import Path
from collections.abc import Callable

from toolkit.errors import PathTaken, bounded_repr, not_allowed

# --- files ---------------------------------------------------------------------------------------------------------


def fsync_path(path: Path) -> None:
    """``path`` (a file, or a folder: its entries) on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``: readers never see half, and
    a link at ``path`` is replaced, never written through."""
    with atomic_files([path]) as (f,):
        f.write(text.encode())


@contextlib.contextmanager
def atomic_files(paths: list[Path]):
    """Binary files to write, one for each of ``paths``, each under a temporary name in its folder; when the block
    ends without an error each is fsynced and renamed over its path, in the order given, so a reader that checks
    the last one finds all of them whole. On an error nothing is renamed and the temporary files are removed."""
    files = []
    try:
        for path in paths:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            files.append((os.fdopen(fd, "wb"), Path(tmp)))
        yield [f for f, _ in files]
        for f, _ in files:
            f.flush()
            os.fsync(f.fileno())
            f.close()
        for (_, tmp), path in zip(files, paths):
            os.replace(tmp, path)
    finally:
        for f, tmp in files:
            f.close()
            tmp.unlink(missing_ok=True)


def open_log(path: Path, text: bool = False, fresh: bool = False):
    """Open a log of a folder that may come from elsewhere (a run directory) for appending (or replacing:
    ``fresh``): a link at ``path`` is refused (O_NOFOLLOW), never written through, and so is anything but a
    regular file. Text mode is line-buffered, so each line reaches the OS as it is written."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    flags |= os.O_TRUNC if fresh else os.O_APPEND
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                errno.ELOOP, not_allowed(path.name, path, "a regular file (or none)", problem="is a link")
            ) from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads (opened without waiting for a reader)
            raise OSError(
                errno.EINVAL, not_allowed(path.name, path, "a regular file", problem="is not a regular file")
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, not_allowed(path.name, path, "a regular file", problem="is not a regular file"))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a" if text else "ab", buffering=1 if text else -1)


FILE_TYPES = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def _open_regular(path: Path, *, field: str, error: type[Exception], allowed: str, as_link: str) -> int:
    """A descriptor of ``path`` opened for reading, which must be a regular file itself: a link is refused, not
    followed (O_NOFOLLOW), and a FIFO is opened without waiting for a writer (O_NONBLOCK), then refused as anything
    but a regular file is. Refusals are ``error``, naming ``field`` and the path: a link's says ``as_link`` (where
    ``{target}`` is where it points) and ``allowed``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            target = bounded_repr(os.readlink(path))
            raise error(not_allowed(field, path, allowed, problem=as_link.format(target=target))) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise error(
            not_allowed(
                field,
                path,
                "a regular file",
                problem=f"is {FILE_TYPES.get(stat.S_IFMT(mode), 'not a file')}, not a regular file",
            )
        )
    return fd


def open_regular_file(path: Path, *, field: str, error: type[Exception]):
    """``path`` open for reading (binary), refused as :func:`read_regular_file` refuses it: for a file from
    elsewhere read in pieces (a run's events.jsonl)."""
    fd = _open_regular(
        path,
        field=field,
        error=error,
        allowed="a regular file (a link is never followed: it could lead anywhere)",
        as_link="is a symbolic link to {target}",
    )
    return os.fdopen(fd, "rb")


def read_regular_file(path: Path, *, field: str, error: type[Exception], limit: int | None = None) -> bytes:
    """The bytes of ``path``, which must be a regular file itself: a copied folder may hold a link to any file
    (not followed: O_NOFOLLOW) or a FIFO that would block the reader forever (opened without waiting:
    O_NONBLOCK); with ``limit``, at most that many bytes (a small metadata file grown to gigabytes is refused,
    not read). Refusals are ``error``, naming ``field`` and the path."""
    with open_regular_file(path, field=field, error=error) as f:
        data = f.read() if limit is None else f.read(limit + 1)
    if limit is not None and len(data) > limit:
        raise error(
            not_allowed(field, path, "the small file Trainbook writes there", problem=f"is over {limit:,} bytes")
        )
    return data


def _opened_path(fd: int) -> str | None:
    """Where the file open as ``fd`` lies now, from the kernel (Linux's /proc, macOS's F_GETPATH); None where
    neither is available."""
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/self/fd/{fd}")
    import fcntl

    if hasattr(fcntl, "F_GETPATH"):
        with contextlib.suppress(OSError):
            return os.fsdecode(fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024)).rstrip(b"\0"))
    return None


@contextlib.contextmanager
def open_inside(path: Path, root: Path | None, *, field: str, error: type[Exception]):
    """``path`` open for reading (a binary file object), for a copy of a folder from elsewhere whose files were
    checked before (a data folder being registered): the file read is the one checked, even if the folder changed
    meanwhile. Refused, as ``error`` naming ``field`` and the path: a link at ``path`` (O_NOFOLLOW: the file was
    swapped for a link since), anything but a regular file (O_NONBLOCK: a FIFO never blocks), and, with ``root``
    (a resolved folder), a file that no longer lies inside it (a folder on its path swapped for a link)."""
    fd = _open_regular(
        path,
        field=field,
        error=error,
        allowed="the file that was checked (a link is never followed: it could lead anywhere)",
        as_link="became a symbolic link to {target} while it was read",
    )
    with os.fdopen(fd, "rb") as f:
        where = _opened_path(fd) if root is not None else None
        if where is not None and not Path(where).is_relative_to(root):
            raise error(
                not_allowed(
                    field,
                    path,
                    f"a file inside {str(root)!r}",
                    problem=f"led to {bounded_repr(where)} when it was read (a folder on its path became a link)",
                )
            )
        yield f


PLAIN_FOLDER = (
    "regular files and plain subfolders only (a link is never followed: it could lead anywhere; a FIFO, "
    "socket or device would block its reader)"
)


class NotPlainEntry(ValueError):
    """An entry of a folder from elsewhere that is neither a regular file nor a plain folder: ``name`` (relative to
    the folder) and ``what`` it is ("a symbolic link to '...'", "a FIFO", ...)."""

    def __init__(self, name: str, what: str):
        super().__init__(f"{name} is {what}")
        self.name, self.what = name, what


def plain_files(folder: Path) -> list[str]:
    """The relative names of every file in ``folder``, at any depth, once each entry is a regular file or a plain
    folder (never followed through a link); NotPlainEntry names the first that is not. Links inside are refused,
    not resolved: where one leads is for whoever made the folder to choose."""
    files, pending = [], [""]
    while pending:
        prefix = pending.pop()
        with os.scandir(folder / prefix) as scan:
            for entry in scan:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(f"{prefix}{entry.name}/")
                elif entry.is_file(follow_symlinks=False):
                    files.append(prefix + entry.name)
                else:
                    raise NotPlainEntry(prefix + entry.name, _entry_kind(entry))
    return sorted(files)


def _entry_kind(entry: os.DirEntry) -> str:
    if entry.is_symlink():
        return f"a symbolic link to {bounded_repr(os.readlink(entry.path))}"
    return FILE_TYPES.get(stat.S_IFMT(entry.stat(follow_symlinks=False).st_mode), "not a regular file")


def check_plain_folder(folder: Path, *, field: str, error: type[Exception]) -> list[str]:
    """:func:`plain_files` of a folder a library is about to read (a model, a tokenizer: transformers opens several
    of its files by name, and follows links), refusing, as ``error`` naming ``field``, the folder, the entry and
    what it is, any link, FIFO, socket or device in it."""
    try:
        return plain_files(Path(folder))
    except NotPlainEntry as exc:
        raise error(not_allowed(field, folder, PLAIN_FOLDER, problem=f"holds {exc.name}, {exc.what}")) from None


# --- hashing ---------------------------------------------------------------------------------------------------------

HASH_CHUNK = 8 << 20  # hashlib releases the GIL on large chunks: training (or serving) goes on meanwhile


def read_hashed(path: Path, out=None, new_hasher=hashlib.sha256) -> tuple[str, int]:
    """(sha256, size) of a file from one read, its bytes also written to ``out`` as they go (a copy that is
    exactly what was hashed, even if the file changes meanwhile). ``new_hasher``: another hashlib-like
    algorithm (toolkit.checkpoint.checksum's checkpoint checksum)."""
    with open(path, "rb") as f:
        return hash_stream(f, out, new_hasher)


def hash_stream(f, out=None, new_hasher=hashlib.sha256) -> tuple[str, int]:
    """:func:`read_hashed` of a file already open (binary), read from where it is to its end."""
    hasher, size = new_hasher(), 0
    while chunk := f.read(HASH_CHUNK):
        hasher.update(chunk)
        size += len(chunk)
        if out is not None:
            out.write(chunk)
    return hasher.hexdigest(), size


def sha256_file(path: Path) -> str:
    return read_hashed(path)[0]


# --- names and entries in a manifest or listing read from disk ----------------------------------------------------

SHA256_RE = re.compile(r"[0-9a-f]{64}")


def name_inside(name) -> bool:
    """A relative path that stays inside its folder, as a manifest or listing from elsewhere may spell it: no
    absolute path, no '..', no empty or '.' part, no backslash or NUL (a name that leaves the folder would make a
    reader hash, load or write a file anywhere)."""
    if not isinstance(name, str) or not name or "\\" in name or "\0" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def file_entry_ok(entry) -> bool:
    """``{"size": bytes, "sha256": hex}`` as a manifest or listing records a file."""
    size = entry.get("size") if isinstance(entry, dict) else None
    return (
        isinstance(size, int)
        and not isinstance(size, bool)
        and size >= 0
        and isinstance(entry.get("sha256"), str)
        and SHA256_RE.fullmatch(entry["sha256"]) is not None
    )


# --- which folder may be replaced ----------------------------------------------------------------------------------


def check_replaceable(
    out: Path,
    *,
    marker: str,
    kind: str,
    error: type[Exception],
    may_hold: Callable[[Path], set],
    field: str = "--out",
    subfolders: frozenset[str] = frozenset(),
) -> None:
    """``out`` may be written: it is missing, an empty folder, or an earlier ``kind`` folder, never a link, a file
    or someone else's folder (replacing deletes what is there). An earlier folder holds ``marker`` and nothing but
    regular files named in ``may_hold(out)`` (which reads the marker, raising ``error`` if it is not one of ours)
    and real folders named in ``subfolders`` (what the writer copies in whole, e.g. a plan's model code): a folder
    that merely contains a file of the marker's name, beside other files, is not replaced. Refusals are ``error``,
    naming ``field``."""
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise error(
            not_allowed(
                field,
                out,
                "a real folder path (a link is never written through or replaced)",
                problem="is a symbolic link",
            )
        )
    allowed = (
        f"a new or empty folder, or an earlier {kind} folder (it holds {marker} and only the files "
        "that lists; it is replaced)"
    )
    if not stat.S_ISDIR(mode):
        raise error(not_allowed(field, out, allowed, problem=f"exists and is not a {kind} folder"))
    with os.scandir(out) as scan:
        entries = {entry.name: entry for entry in scan}
    if not entries:
        return
    if marker not in entries or not entries[marker].is_file(follow_symlinks=False):
        raise error(not_allowed(field, out, allowed, problem=f"exists and is not a {kind} folder (no {marker})"))
    try:
        known = set(may_hold(out)) | {marker}
    except error as exc:
        raise error(not_allowed(field, out, allowed, problem=f"exists and is not a {kind} folder ({exc})")) from None
    for name, entry in sorted(entries.items()):
        ours = entry.is_file(follow_symlinks=False) or (name in subfolders and entry.is_dir(follow_symlinks=False))
        if name not in known | subfolders or not ours:
            raise error(
                not_allowed(field, out, allowed, problem=f"holds {bounded_repr(name)}, which a {kind} folder does not")
            )


# --- staging: where a folder is assembled ---------------------------------------------------------------------------


def _staging_names(out: Path) -> re.Pattern:
    # .NAME.<hex>.tmp: being assembled (or, after a swap, the previous folder being removed); .NAME.<hex>.old:
    # what a publisher without the one-step swap leaves when killed between its two renames.
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


# --- publishing: replacing a folder in one step ---------------------------------------------------------------------


def fsync_tree(folder: Path) -> None:
    """Every file in ``folder`` and the folder itself on disk: after the swap, a power cut cannot leave a
    published folder whose names are there and whose bytes are not."""
    for entry in os.scandir(folder):
        if entry.is_file(follow_symlinks=False):
            fsync_path(Path(entry.path))
        elif entry.is_dir(follow_symlinks=False):
            fsync_tree(Path(entry.path))
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
                raise PathTaken(exc.errno, f"{dest} appeared while {new} was published") from None
            raise
        return None
    if exchange(new, dest):
        return new
    return replace_in_two_steps(new, dest)


def publish_folder(
    tmp: Path,
    out: Path,
    *,
    marker: str,
    kind: str,
    error: type[Exception],
    may_hold: Callable[[Path], set],
    field: str = "--out",
    subfolders: frozenset[str] = frozenset(),
) -> None:
    """Make the assembled folder ``tmp`` (from :func:`staging_folder`) the folder ``out``: fsync every file and
    the folder, check once more that ``out`` may be replaced (:func:`check_replaceable`: it may have changed
    during the work), swap in one step, fsync the parent (the swap itself is durable), then remove the previous
    folder."""
    fsync_tree(tmp)
    rule = {
        "marker": marker,
        "kind": kind,
        "error": error,
        "may_hold": may_hold,
        "field": field,
        "subfolders": subfolders,
    }
    check_replaceable(out, **rule)
    try:
        previous = swap_in(tmp, out)
    except FileExistsError:  # a concurrent publisher put its folder there between the check and the rename
        check_replaceable(out, **rule)
        previous = swap_in(tmp, out)
    fsync_path(out.parent)
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
