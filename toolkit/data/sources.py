"""Where a run's text comes from, as something to tokenize: a built-in corpus, a registered asset or a data.path,
each with its content hash and its files' records (toolkit.data.documents) read one file at a time.

A registered version's files are its listing (never a walk of its snapshot), and each file is hashed as it is read:
bytes that are not the ones the asset was hashed as are refused before anything is cached, so the tokens are what
the lineage names.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from collections.abc import Callable, Iterator

from toolkit.data.documents import DataFormat, file_records, is_jsonl, table_records


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


def asset_source(asset, shown: str) -> Source:
    """A text asset (uri_file or uri_folder, registered or read in place), its files in content-hash order."""
    from toolkit.catalogue.data_assets import asset_files, check_unchanged
    from toolkit.fsio import read_hashed

    if not asset.sha256:
        raise ValueError(f"data: {asset.source!r} was opened without hashing; a token file needs its content hash")

    def batches(fmt: DataFormat):
        read = []
        for name, path in asset_files(asset):
            buffer = io.BytesIO()
            digest, size = read_hashed(path, buffer)
            read.append({"name": name, "sha256": digest, "size": size})
            yield file_records(name, buffer.getvalue(), fmt, _where(asset, name)), size, ("line", _where(asset, name))
        check_unchanged(asset, read)

    return Source(shown, asset.sha256, asset.size_bytes, any(is_jsonl(e["name"]) for e in asset.listing), batches)


def table_source(asset, shown: str) -> Source:
    """An MLTable asset of labelled text (a text column and a label column)."""
    from toolkit.catalogue.mltable import load_mltable

    def batches(fmt: DataFormat):
        yield table_records(load_mltable(asset.path), fmt, shown), asset.size_bytes, ("row", shown)

    return Source(shown, asset.sha256, asset.size_bytes, True, batches)


def text_sha256(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()
