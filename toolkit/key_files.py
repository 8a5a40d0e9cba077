"""Secrets at rest: an endpoint's key and the key that signs this user's runs (toolkit.trust).

A key file is made once and reused. It is written whole or not at all (a temporary file, fsynced, then linked or
renamed into place), so a full disk cannot leave an empty key that a server would compare tokens against; and it is
checked on every read: a regular file of this user, mode 0600, holding a key of the generated shape.

    ensure(path, what)   the key, made when missing, replaced (saying why) when it is not one we would serve
    read(path, what)     the key, checked, never made: the server's read, which must fail rather than serve a bad key
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UserError, refused

KEY_BYTES = 32
KEY_SHAPE = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32): 32 random bytes, base64url, no padding
KEY_SHAPE_TEXT = "43 characters of A-Z, a-z, 0-9, '-' and '_' (32 random bytes)"
READ_LIMIT = 4096  # a key is 43 bytes; a huge file is not read whole to find that out
PRIVATE = 0o600


class KeyFileError(UserError, ValueError):
    """A key file that is not a regular file of this user, or cannot be read or written; the message names it."""


@dataclass(frozen=True)
class KeyFile:
    path: Path
    key: str
    mode: int
    """The file's permission bits as found after ensure() (0o600 for every key Trainbook made)."""
    note: str = ""
    """What ensure() did beyond reading: made the key, or replaced a bad one and why (empty: the key was reused)."""

    @property
    def mode_text(self) -> str:
        return f"{self.mode:04o}"


def ensure(path: Path, what: str) -> KeyFile:
    """The key in ``path``: made when missing; replaced with a new one when the file is empty, not of the generated
    shape or readable by others (``note`` says which: clients of the old key need the new one). A link, a folder or
    a FIFO there, or a file of another user, is refused: it is not ours to replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        key, problem = _inspect(path, what)
    except FileNotFoundError:
        made = _write_new(path, replace=False)  # None: another process made it first, and that key is read
        return _found(path, what, note=f"{what}: made {path} (mode 0600)" if made else "")
    if problem is None:
        return KeyFile(path, key, stat.S_IMODE(os.lstat(path).st_mode))
    _write_new(path, replace=True)
    return _found(path, what, note=f"{what}: {path} {problem}; replaced it with a new key (mode 0600)")


def read(path: Path, what: str) -> str:
    """The key in ``path``, checked as :func:`ensure` checks it; anything else is a KeyFileError naming the file,
    what is wrong and how to get a good key (never a key that is empty or readable by others)."""
    key, problem = _inspect(path, what)
    if problem is not None:
        raise KeyFileError(
            refused(
                f"{what} {path}",
                problem,
                f"a key file made by Trainbook: {KEY_SHAPE_TEXT}, mode 0600 (remove it: a new one is made)",
            )
        )
    return key


def _found(path: Path, what: str, note: str) -> KeyFile:
    """The key now in ``path`` (made here, or by a process that got there first), checked."""
    key = read(path, what)
    return KeyFile(path, key, stat.S_IMODE(os.lstat(path).st_mode), note=note)


def _inspect(path: Path, what: str) -> tuple[str, str | None]:
    """(the key, None) for a good key file, ("", why) for one to replace; KeyFileError for one we may not touch."""
    allowed = f"a regular file of yours holding {KEY_SHAPE_TEXT}, mode 0600 (remove it: a new one is made)"
    _refuse_unless_regular(os.lstat(path), path, what, allowed)  # FileNotFoundError: the caller makes one
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise KeyFileError(refused(f"{what} {path}", f"cannot be read ({exc.strerror})", allowed)) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())  # what was opened, not what the name meant a moment before
        _refuse_unless_regular(info, path, what, allowed)
        raw = f.read(READ_LIMIT + 1)
    text = raw.decode("ascii", errors="replace").strip()
    if not text:
        return "", "is empty"
    if not KEY_SHAPE.fullmatch(text):
        return "", f"does not hold a key ({len(raw):,} bytes; a key is {KEY_SHAPE_TEXT})"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return "", f"is readable or writable by others (mode {stat.S_IMODE(info.st_mode):04o}), so the key may be known"
    return text, None


def _refuse_unless_regular(info: os.stat_result, path: Path, what: str, allowed: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = (
            "a link"
            if stat.S_ISLNK(info.st_mode)
            else "a folder"
            if stat.S_ISDIR(info.st_mode)
            else "not a regular file (a FIFO, socket or device)"
        )
        raise KeyFileError(refused(f"{what} {path}", f"is {kind}", allowed))
    if info.st_uid != os.geteuid():
        raise KeyFileError(refused(f"{what} {path}", f"belongs to user id {info.st_uid}, not to you", allowed))


def _write_new(path: Path, replace: bool) -> str | None:
    """Write a new key beside ``path`` and put it in place whole: renamed over a bad one (``replace``), or linked
    only if no file is there yet (None: another process made one first; the caller reads it)."""
    key = secrets.token_urlsafe(KEY_BYTES)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), PRIVATE)  # whatever the umask
            f.write(key)
            f.flush()
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails if a file appeared meanwhile: exactly one key wins
            except FileExistsError:
                return None
        _fsync_folder(path.parent)
    except OSError as exc:
        raise KeyFileError(
            refused(f"{path}", f"a new key cannot be written ({exc.strerror})", "a writable folder with free space")
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    return key


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
