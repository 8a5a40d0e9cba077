"""The text corpora that ship with every Python: no download, the same bytes on every machine of a version.

pydoc_documents()    CPython's documentation (pydoc_data.topics, ~466 kB of English and code), one per topic
stdlib_documents()   the standard library's own .py sources (~11 MB of code), one per file
*_text()             the documents joined by SEPARATOR: the bytes a byte-level model trains on
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

from toolkit.data.documents import SEPARATOR

STDLIB_SKIP = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3"}


def pydoc_documents() -> list[bytes]:
    """Every pydoc topic, in a fixed order (sorted by topic name)."""
    from pydoc_data.topics import topics

    return [topics[key].encode("utf-8") for key in sorted(topics)]


def pydoc_text() -> bytes:
    return SEPARATOR.join(pydoc_documents())


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[Path]:
    """The standard library's own .py sources, in a fixed order: a real code corpus in every Python (tests,
    third-party site-packages and IDLE left out)."""
    root = _stdlib_root()
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in STDLIB_SKIP]  # pruned, not walked: site-packages is large
        found += [Path(folder) / n for n in names if n.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def stdlib_documents() -> list[bytes]:
    """Each file of :func:`stdlib_files`, preceded by a '# file: NAME' line."""
    root = _stdlib_root()
    return [b"# file: " + p.relative_to(root).as_posix().encode() + b"\n" + p.read_bytes() for p in stdlib_files()]


def stdlib_text() -> bytes:
    return SEPARATOR.join(stdlib_documents())
