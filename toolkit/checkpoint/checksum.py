"""Checksums of checkpoint files, and the one-pass writer that computes them while it writes.

A checkpoint's checksum is there to catch a torn or corrupted write, not tampering: a manifest stored beside
the files it describes proves nothing against someone who can rewrite both (untrusted checkpoints are made
safe by ``toolkit.safe_load``, not by hashes). So checkpoints use xxh3-128, which measured here hashes at
~14 GB/s against sha256's 1.6 GB/s, and compute it on the bytes as they are written instead of reading the
file back. Manifests written before this carry sha256, which is still verified. Exports and data assets keep
sha256 (their hash is their identity in the registry; see toolkit.fsio).

:class:`ChecksummedWriter` is the file object ``torch.save`` writes into. Where the filesystem allows it, it
writes with O_DIRECT through a small reused, page-aligned buffer: the bytes go from memory to the disk without
a page-cache copy. On this machine that matters more than the copy itself: filling fresh page-cache pages for
a 1.1 GiB file cost up to 5 s of CPU in a new process (the VM faults in every page), O_DIRECT 0.05 s. Where
O_DIRECT is refused (tmpfs, some network filesystems), it falls back to ordinary buffered writes.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import xxhash

# numpy is imported by the functions that write, not here: the CLI and every supervisor import this module (through
# toolkit.checkpoint.store) only to verify checkpoints, and numpy would add about 0.1 s to each of them
from toolkit.fsio import HASH_CHUNK, SHA256_RE, read_hashed


@dataclass(frozen=True)
class Algorithm:
    new: Callable
    hex_re: re.Pattern


ALGORITHMS = {
    "xxh3_128": Algorithm(xxhash.xxh3_128, re.compile(r"[0-9a-f]{32}")),
    "sha256": Algorithm(hashlib.sha256, SHA256_RE),
}
CHECKPOINT_CHECKSUM = "xxh3_128"  # what new checkpoints record; every name in ALGORITHMS is still verified


def entry_checksum(entry) -> tuple[str, str] | None:
    """(algorithm, hex) of a manifest entry ``{"size": n, "<algorithm>": hex}``; None unless it holds exactly one
    known checksum, well formed, and a size."""
    if not isinstance(entry, dict):
        return None
    size = entry.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        return None
    found = [(name, entry[name]) for name in ALGORITHMS if name in entry]
    if len(found) != 1:
        return None
    name, value = found[0]
    return (name, value) if isinstance(value, str) and ALGORITHMS[name].hex_re.fullmatch(value) else None


def file_checksum(path: Path, algorithm: str = CHECKPOINT_CHECKSUM) -> str:
    return read_hashed(path, new_hasher=ALGORITHMS[algorithm].new)[0]


BLOCK = 4096  # O_DIRECT wants offsets, lengths and the buffer aligned to the device block
BOUNCE_BYTES = 32 << 20  # the reused aligned buffer: big enough for few syscalls, small enough to stay in memory


class ChecksummedWriter:
    """A write-only file that checksums what it is given. ``torch.save(obj, writer)``, then :meth:`close`
    (fsyncs) returns ``{"size": n, "xxh3_128": hex}``, the manifest entry. ``bounce`` is a reusable buffer from
    :func:`bounce_buffer` (one per writing thread)."""

    def __init__(self, path: Path, bounce: mmap.mmap | None):
        self.path, self.size = Path(path), 0
        self.hasher = ALGORITHMS[CHECKPOINT_CHECKSUM].new()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW  # a stale file from a killed attempt is
        # overwritten; a link in its place is refused, never written through
        self.fd, self.direct = -1, False
        if bounce is not None and hasattr(os, "O_DIRECT"):
            try:
                self.fd, self.direct = os.open(self.path, flags | os.O_DIRECT, 0o644), True
            except OSError:
                pass  # the filesystem refuses O_DIRECT: buffered below
        if self.fd < 0:
            self.fd = os.open(self.path, flags, 0o644)
        import numpy as np

        self.bounce = np.frombuffer(bounce, dtype=np.uint8) if self.direct else None
        self.filled = 0  # bytes waiting in the bounce buffer
        self.flushed = 0  # bytes on disk (a multiple of BLOCK while writing)

    def write(self, data) -> int:
        import numpy as np

        view = np.frombuffer(data, dtype=np.uint8)
        self.hasher.update(view)
        n = view.size
        if not self.direct:
            _write_all(self.fd, memoryview(view), None)
        else:
            done = 0
            while done < n:
                take = min(n - done, self.bounce.size - self.filled)
                np.copyto(self.bounce[self.filled : self.filled + take], view[done : done + take])  # no GIL held
                self.filled += take
                done += take
                if self.filled == self.bounce.size:
                    self._drain()
        self.size += n
        return n

    def flush(self) -> None:
        pass  # torch.save calls it at the end; the bytes are made durable in close()

    def _drain(self) -> None:
        """Write the bounce buffer (padded to a whole block: the excess is cut off in close())."""
        padded = -(-self.filled // BLOCK) * BLOCK
        _write_all(self.fd, memoryview(self.bounce)[:padded], self.flushed)
        self.flushed += self.filled
        self.filled = 0

    def close(self) -> dict:
        try:
            if self.direct and self.filled:
                self._drain()
                os.ftruncate(self.fd, self.size)  # drop the last block's padding
            os.fsync(self.fd)
        finally:
            self.abort()
        return {"size": self.size, CHECKPOINT_CHECKSUM: self.hasher.hexdigest()}

    def abort(self) -> None:
        """Close the file (once: a second call does nothing, so an error path may always call it)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


def _write_all(fd: int, view: memoryview, offset: int | None) -> None:
    done = 0
    while done < len(view):
        chunk = view[done : done + HASH_CHUNK * 8]
        written = os.write(fd, chunk) if offset is None else os.pwrite(fd, chunk, offset + done)
        if written <= 0 or (offset is not None and written < len(chunk) and written % BLOCK):
            raise OSError(f"short write: {written} of {len(chunk)} bytes")  # never loop, never misalign
        done += written


def bounce_buffer() -> mmap.mmap:
    """A page-aligned buffer for :class:`ChecksummedWriter`, touched once so that no write pays to fault it in."""
    import numpy as np

    buf = mmap.mmap(-1, BOUNCE_BYTES)
    np.frombuffer(buf, dtype=np.uint8)[:: mmap.PAGESIZE] = 0
    return buf
