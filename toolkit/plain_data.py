"""Documents from elsewhere (a run config, a DeepSpeed config) read as plain data: mappings with string keys, lists,
strings, numbers, booleans and null, and nothing a parser could be made to spend minutes or gigabytes on.

    data = read_document(text, "yaml")     (or "json"); raises PlainDataError saying what is wrong and where
    value = loads_json(text)               json.loads, with nesting too deep for the parser a PlainDataError
    text = read_text(path)                 a document file's text, refused unread when over MAX_DOCUMENT_BYTES

Refused: YAML anchors and aliases (a 400-byte "billion laughs" file expands to gigabytes; configs never need them),
duplicate keys (the last one would win silently; DeepSpeed's own loader refuses them too), keys that are not strings,
nesting deeper than MAX_DEPTH, numbers that are not finite, and documents over MAX_DOCUMENT_BYTES (a 300 MB YAML
file took PyYAML 208 s and 657 MB).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import yaml

from toolkit.errors import UserError, refused

MAX_DEPTH = 32  # a DeepSpeed config nests 3 levels, a Trainbook config 4
MAX_DOCUMENT_BYTES = 1 << 20  # a config is a few KB (the largest shipped, demo.yaml, 1.4 KB); DeepSpeed's a few KiB
# A run's config.yaml: a config of at most MAX_DOCUMENT_BYTES written out again with every field and default
RESOLVED_CONFIG_MAX_BYTES = 4 * MAX_DOCUMENT_BYTES


class PlainDataError(UserError, ValueError):
    """A document that is not plain data; the message says what and where (a key path or a line)."""


class _PlainLoader(yaml.SafeLoader):
    """YAML's safe loader without anchors, aliases or repeated keys."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise PlainDataError(
                f"line {event.start_mark.line + 1}: an anchor or alias (&name, *name); a config spells each value out"
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise PlainDataError(f"line {key_node.start_mark.line + 1}: the key {key!r} is not a string")
            if key in seen:
                raise PlainDataError(f"line {key_node.start_mark.line + 1}: the key {key!r} appears twice")
            seen.add(key)
        return super().construct_mapping(node, deep)


def _no_duplicates(pairs: list) -> dict:
    keys = [key for key, _ in pairs]
    repeated = next((key for key in keys if keys.count(key) > 1), None)
    if repeated is not None:
        raise PlainDataError(f"the key {repeated!r} appears twice")
    return dict(pairs)


def _over_the_cap(size: int, unit: str) -> PlainDataError:
    return PlainDataError(
        refused(
            None,
            f"{size:,} {unit} is over the cap and was not read",
            f"a document of at most {MAX_DOCUMENT_BYTES:,} bytes (a config is a few KB)",
        )
    )


def read_text(path: Path) -> str:
    """The text of the document file ``path``, its size checked before it is read: one over MAX_DOCUMENT_BYTES is
    refused unread, and a file growing meanwhile is read up to the cap only, then refused too."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(MAX_DOCUMENT_BYTES + 1) if size <= MAX_DOCUMENT_BYTES else b""
    if max(size, len(data)) > MAX_DOCUMENT_BYTES:
        raise _over_the_cap(max(size, len(data)), "bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlainDataError(f"not UTF-8 text (byte {exc.start:,})") from None


def read_document(text: str, kind: str):
    """``text`` parsed as ``kind`` ("yaml" or "json") and checked to be plain data (see the module doc)."""
    if len(text) > MAX_DOCUMENT_BYTES:  # text from anywhere else: never handed to the parser either
        raise _over_the_cap(len(text), "characters")
    try:
        if kind == "json":
            data = json.loads(text, object_pairs_hook=_no_duplicates)
        else:
            data = yaml.load(text, Loader=_PlainLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise PlainDataError(f"nested deeper than {MAX_DEPTH} levels") from None
    except (yaml.YAMLError, ValueError) as exc:
        if isinstance(exc, PlainDataError):
            raise
        raise PlainDataError(f"not valid {kind.upper()}: {str(exc).splitlines()[0]}") from None
    check_plain(data)
    return data


def loads_json(text: str | bytes, **options):
    """``json.loads`` of JSON from elsewhere: JSON nested about as deep as Python's recursion limit, where json's
    decoder raises RecursionError, is a PlainDataError (a ValueError, as JSONDecodeError is) like any bad JSON."""
    try:
        return json.loads(text, **options)
    except RecursionError:
        raise PlainDataError("JSON nested too deeply to read") from None


def check_plain(data, where: str = "", depth: int = 0) -> None:
    """Refuse anything in ``data`` but string-keyed mappings, lists, strings, finite numbers, booleans and null."""
    if depth > MAX_DEPTH:
        raise PlainDataError(f"{where or 'the document'}: nested deeper than {MAX_DEPTH} levels")
    if isinstance(data, dict):
        for key, value in data.items():
            if not isinstance(key, str):
                raise PlainDataError(f"{where or 'the document'}: the key {key!r} is not a string")
            check_plain(value, f"{where}.{key}" if where else key, depth + 1)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            check_plain(value, f"{where}[{i}]", depth + 1)
    elif isinstance(data, float) and not math.isfinite(data):
        raise PlainDataError(f"{where or 'the document'}: {data} is not a finite number")
    elif not (data is None or isinstance(data, (str, int, float, bool))):
        raise PlainDataError(f"{where or 'the document'}: a {type(data).__name__} is not plain data")
