"""Where a run's text comes from, as something to tokenize: a built-in corpus, a registered asset or a data.path,
each with its content hash and its files' records (toolkit.data.documents) read one file at a time.

A registered version's files are its listing (never a walk of its snapshot), and each file is hashed as it is read:
bytes that are not the ones the asset was hashed as are refused before anything is cached, so the tokens are what
the lineage names.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from collections.abc import Callable, Iterator

from toolkit.data.documents import DataFormat, DataFormatError, file_records, is_jsonl, line_records, table_records
from toolkit.errors import refused


@dataclass
class Source:
    name: str  # a built-in's name, an asset's ref, or the path read in place
    sha256: str
    size_bytes: int
    has_jsonl: bool  # some file is JSON Lines (the format tag then names the fields read)
    batches: Callable[[DataFormat], Iterator[tuple[list, int, tuple[str, str]]]]  # see build_token_files


def builtin_source(name: str, documents: list[bytes], text_sha256: str) -> Source:
    """A built-in corpus (``documents``; ``text_sha256``: the hash of the bytes a byte-level model reads)."""
    size = sum(map(len, documents))
    return Source(name, text_sha256, size, False, lambda fmt: iter([(documents, size, ("document", name))]))


def _where(asset, name: str) -> str:
    if asset.version:
        return f"{name!r} of {asset.ref}"
    return repr(str(asset.path if asset.type == "uri_file" else asset.path / name))


# A JSON Lines file is read a run of lines at a time, hashed as it is read: what is held is the run's records, not
# the file. A plain-text file is one document, read whole, so it has a cap, checked before it is read.
JSONL_RUN_BYTES = 8 << 20
MAX_LINE_BYTES = 64 << 20  # one record (a conversation, a document): far above any dataset's
MAX_DOCUMENT_BYTES = 256 << 20  # tokenized at once, it takes several times its size in memory


def asset_source(asset, shown: str) -> Source:
    """A text asset (uri_file or uri_folder, registered or read in place), its files in content-hash order."""
    from toolkit.catalogue.data_assets import asset_files, check_unchanged

    if not asset.sha256:
        raise ValueError(f"data: {asset.source!r} was opened without hashing; a token file needs its content hash")

    def batches(fmt: DataFormat):
        read = []
        for name, path in asset_files(asset):
            where, hasher, size = _where(asset, name), hashlib.sha256(), 0
            with open(path, "rb") as f:
                runs = _jsonl_runs(f, hasher, fmt, where) if is_jsonl(name) else _document(f, hasher, name, fmt, where)
                for records, run_bytes in runs:
                    size += run_bytes
                    yield records, run_bytes, ("line", where)
            read.append({"name": name, "sha256": hasher.hexdigest(), "size": size})
        check_unchanged(asset, read)  # after the last file: a file changed meanwhile is refused, nothing published

    return Source(shown, asset.sha256, asset.size_bytes, any(is_jsonl(e["name"]) for e in asset.listing), batches)


def _jsonl_runs(f, hasher, fmt: DataFormat, where: str) -> Iterator[tuple[list, int]]:
    """(records, bytes read) of about JSONL_RUN_BYTES of lines at a time; a line over MAX_LINE_BYTES is refused
    when its first MAX_LINE_BYTES have been read, the rest of it never."""
    lines, size, number = [], 0, 0
    while line := f.readline(MAX_LINE_BYTES + 1):
        hasher.update(line)
        number += 1
        if len(line) > MAX_LINE_BYTES:
            raise DataFormatError(
                refused("data", f"line {number} of {where} is over {MAX_LINE_BYTES:,} bytes", fmt.allowed())
            )
        lines.append((number, line.removesuffix(b"\n")))
        size += len(line)
        if size >= JSONL_RUN_BYTES:
            yield line_records(lines, fmt, where), size
            lines, size = [], 0
    if lines:
        yield line_records(lines, fmt, where), size


def _document(f, hasher, name: str, fmt: DataFormat, where: str) -> Iterator[tuple[list, int]]:
    """A plain-text file's one record (file_records refuses it for a format that reads JSON Lines), refused unread
    over MAX_DOCUMENT_BYTES."""
    size = os.fstat(f.fileno()).st_size
    if size > MAX_DOCUMENT_BYTES:
        raise DataFormatError(
            refused(
                "data",
                f"{where} is {size:,} bytes, over the {MAX_DOCUMENT_BYTES:,} a plain-text file may have (it is one "
                "document, tokenized at once)",
                "plain-text files of at most that size (a folder of them is an asset), or JSON Lines, which are read "
                "a line at a time",
            )
        )
    data = f.read(MAX_DOCUMENT_BYTES + 1)  # a file growing meanwhile: its hash will not match, and it is refused
    hasher.update(data)
    yield file_records(name, data, fmt, where), len(data)


def table_source(asset, shown: str) -> Source:
    """An MLTable asset of labelled text (a text column and a label column)."""
    from toolkit.catalogue.mltable import load_mltable

    def batches(fmt: DataFormat):
        yield table_records(load_mltable(asset.path), fmt, shown), asset.size_bytes, ("row", shown)

    return Source(shown, asset.sha256, asset.size_bytes, True, batches)


def text_sha256(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()
