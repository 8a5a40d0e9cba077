"""Token files: a data source tokenized once per (content hash, tokenizer, format) into memory-mapped files in the
user cache, never beside the data (not in a snapshot, not in the user's folder).

    <cache>/tokens/<sha256>-<tokenizer key><format tag>.<u8|u16|u32>    the token ids, in the narrowest dtype the
                                                                         vocabulary fits (bytes: u8)
                   ...same stem....starts.i64     example i is tokens[starts[i]:starts[i + 1]] (examples only)
                   ...same stem....mask.u8        1 where a token counts for the loss (instruction and chat data)
                   ...same stem....labels.i64     each example's class id (labelled data)
                   ...same stem....meta.json      what was tokenized: counts, class names, tokenizer, format

Byte-level plain text keeps the name it always had, ``<sha256>-bytes-v1.u8`` (its format tag is empty). Every
file is written under a temporary name and renamed into place (toolkit.fsio.atomic_files), the token file last:
when it exists, its companions are complete. Two processes building the same files write the same bytes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Iterable, Iterator

import numpy as np

from toolkit import paths
from toolkit.data.documents import SEPARATOR, DataFormat, DataFormatError
from toolkit.data.tokenizers import BYTES_KEY, ByteTokenizer
from toolkit.errors import RefusedValue, refused
from toolkit.fsio import atomic_files, read_hashed

DTYPES = ((2**8, np.uint8, "u8"), (2**16, np.uint16, "u16"), (2**32, np.uint32, "u32"))
PIECE_CHARS = 1 << 20  # a long document is encoded in pieces of about this many characters, cut after a newline
BATCH_CHARS = 8 << 20  # characters handed to the tokenizer at once (it encodes a batch on every core)
COMPANIONS = {"starts": ".starts.i64", "mask": ".mask.u8", "labels": ".labels.i64"}


def token_dtype(vocab_size: int) -> tuple[type, str]:
    """(numpy dtype, file suffix) of the narrowest unsigned integer that holds every id below ``vocab_size``."""
    for limit, dtype, suffix in DTYPES:
        if vocab_size <= limit:
            return dtype, suffix
    raise RefusedValue(f"a vocabulary of {vocab_size:,} ids does not fit 32-bit token files")


def token_dir() -> Path:
    return paths.cache_dir() / "tokens"


@dataclass
class TokenFiles:
    path: Path  # the token file
    tokens: np.ndarray
    starts: np.ndarray | None
    mask: np.ndarray | None
    labels: np.ndarray | None
    meta: dict


def _companions(path: Path) -> dict[str, Path]:
    stem = path.name.rsplit(".", 1)[0]
    return {
        **{k: path.with_name(stem + suffix) for k, suffix in COMPANIONS.items()},
        "meta": path.with_name(stem + ".meta.json"),
    }


def _map(path: Path, dtype) -> np.ndarray:
    # mode "c" (copy-on-write): a writable view for torch that never writes to the file; ranks and DataLoader
    # workers share the page cache instead of each holding a copy
    return np.memmap(path, dtype=dtype, mode="c")


def open_token_files(path: Path) -> TokenFiles | None:
    """The files at ``path`` (the token file) and its companions, memory-mapped; None when not built yet."""
    if not path.exists():
        return None
    companions = _companions(path)
    meta = json.loads(companions["meta"].read_text())
    dtype = {suffix: dtype for _, dtype, suffix in DTYPES}[path.suffix[1:]]
    kept = {
        k: _map(companions[k], np.uint8 if k == "mask" else np.int64) if k in meta["companions"] else None
        for k in COMPANIONS
    }
    return TokenFiles(path, _map(path, dtype), kept["starts"], kept["mask"], kept["labels"], meta)


def pieces_of(text: str) -> list[str]:
    """A long text cut after newlines into pieces of about PIECE_CHARS (a tokenizer's memory grows with its
    input); the ids of the pieces, joined, are the text's ids but for the few tokens that would have spanned a cut."""
    found, start = [], 0
    while len(text) - start > PIECE_CHARS:
        cut = text.rfind("\n", start + PIECE_CHARS // 2, start + PIECE_CHARS) + 1 or start + PIECE_CHARS
        found.append(text[start:cut])
        start = cut
    found.append(text[start:])
    return found


def encode_texts(tokenizer, texts: list, dtype) -> list[np.ndarray]:
    """Each text's ids as an array of ``dtype`` (bytes: the UTF-8 bytes themselves; others: decoded as UTF-8,
    invalid bytes replaced, and encoded in batches)."""
    if isinstance(tokenizer, ByteTokenizer):
        return [np.frombuffer(t if isinstance(t, bytes) else t.encode("utf-8"), dtype=np.uint8) for t in texts]
    strings = [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else t for t in texts]
    pieces, owner = [], []
    for i, text in enumerate(strings):
        for piece in pieces_of(text):
            pieces.append(piece)
            owner.append(i)
    encoded = tokenizer.encode_batch(pieces) if pieces else []
    parts: list[list[np.ndarray]] = [[] for _ in strings]
    for i, ids in zip(owner, encoded):
        parts[i].append(np.asarray(ids, dtype=dtype))
    return [np.concatenate(p) if len(p) > 1 else p[0] if p else np.zeros(0, dtype) for p in parts]


def _chunks(records: list, text_of) -> Iterator[list]:
    """``records`` in runs of about BATCH_CHARS characters."""
    chunk, size = [], 0
    for record in records:
        chunk.append(record)
        size += len(text_of(record))
        if size >= BATCH_CHARS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class _Writer:
    """Appends one format's records to open token (and companion) files."""

    def __init__(self, tokenizer, fmt: DataFormat, dtype, files: dict):
        self.tokenizer, self.fmt, self.dtype, self.files = tokenizer, fmt, dtype, files
        end = [tokenizer.eos_id] if tokenizer.eos_id is not None else tokenizer.encode(SEPARATOR.decode())
        self.end = np.asarray(end, dtype=dtype)  # between documents; after each example's completion
        self.count = 0  # tokens written
        self.records = 0
        self.starts: list[int] = [0]
        self.labels: list = []
        if fmt.chat:  # conversations, or preference pairs whose prompts are turns
            from toolkit.data.chat import ChatTemplate

            self.template = ChatTemplate(tokenizer)

    def _tokens(self, ids: np.ndarray) -> None:
        self.files["tokens"].write(np.ascontiguousarray(ids, dtype=self.dtype).tobytes())
        self.count += len(ids)

    def _example(self, ids: np.ndarray, counted: np.ndarray) -> None:
        """One example: its ids, and 1 where a token counts for the loss."""
        self._tokens(ids)
        self.files["mask"].write(np.asarray(counted, dtype=np.uint8).tobytes())
        self.starts.append(self.count)

    def _answered(
        self, prompts: list, answers: list[list[str]], places: list[str]
    ) -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
        """Per prompt, (ids, counted) of it followed by each of its answers, the answer's tokens (and what ends it)
        counted: text prompts (each tokenized once) as instruction pairs are written, turns through the chat
        template."""
        if not self.fmt.chat:
            flat = self._encode([answer for group in answers for answer in group])
            for prompt, group in zip(self._encode(prompts), answers):
                examples = []
                for answer in flat[: len(group)]:
                    completion = np.concatenate([answer, self.end])
                    counted = np.repeat(np.uint8([0, 1]), [len(prompt), len(completion)])
                    examples.append((np.concatenate([prompt, completion]), counted))
                flat = flat[len(group) :]
                yield examples
            return
        for turns, group, place in zip(prompts, answers, places):
            yield [
                tuple(self.template.tokens([*turns, {"role": "assistant", "content": a}], True, place)) for a in group
            ]

    def _encode(self, texts: list) -> list[np.ndarray]:
        return encode_texts(self.tokenizer, texts, self.dtype)

    def add(self, chunk: list, where: str) -> None:
        encode = self._encode
        if self.fmt.mode == "preference":  # each pair two examples, chosen then rejected
            pairs = self._answered([r[0] for r in chunk], [[r[1], r[2]] for r in chunk], [r[3] for r in chunk])
            for pair in pairs:
                for ids, counted in pair:
                    self._example(np.asarray(ids), counted)
                self.records += 1
        elif self.fmt.mode == "chat":
            last_only = self.fmt.assistant_loss == "last"
            for messages, number in chunk:
                ids, counted = self.template.tokens(messages, last_only, f"line {number} of {where}")
                self._example(np.asarray(ids), counted)
                self.records += 1
        elif self.fmt.mode == "text":
            for ids in encode(chunk):
                if self.records:
                    self._tokens(self.end)
                self._tokens(ids)
                self.records += 1
        elif self.fmt.mode == "instruction":
            for ((ids, counted),) in self._answered([p for p, _ in chunk], [[c] for _, c in chunk], []):
                self._example(ids, counted)
                self.records += 1
        else:
            for ids, (_, label, _) in zip(encode([t for t, _, _ in chunk]), chunk):
                self._tokens(ids)
                self.starts.append(self.count)
                self.labels.append(label)
                self.records += 1


def record_text(fmt: DataFormat):
    """A function from one of ``fmt``'s records to its text (for sizing batches and training tokenizers)."""
    if fmt.mode == "chat":
        return lambda record: "\n".join(m["content"] for m in record[0])
    if fmt.mode == "instruction":
        return lambda record: record[0] + record[1]
    if fmt.mode == "preference":  # (prompt: text or turns, chosen, rejected, place)
        prompt_text = (lambda turns: "\n".join(m["content"] for m in turns)) if fmt.chat else (lambda text: text)
        return lambda record: "\n".join([prompt_text(record[0]), record[1], record[2]])
    return (lambda record: record[0]) if fmt.mode == "labelled" else (lambda record: record)


def build_token_files(
    sha256: str,
    tokenizer,
    fmt: DataFormat,
    tag: str,
    batches: Iterable[tuple[list, int, tuple]],
    total_bytes: int,
    shown: str,
) -> TokenFiles:
    """The token files of a source (content hash ``sha256``) for ``tokenizer`` and ``fmt`` (``tag``: the format's
    part of the name), built from ``batches`` unless they are cached: each file's records
    (:func:`toolkit.data.documents.file_records`), its size in bytes, and (unit, where) naming its lines in messages.
    ``batches`` is only iterated when building; it may raise (a changed file, a bad line) and then nothing is
    published. A progress bar shows when tokenizing takes more than two seconds."""
    from tqdm import tqdm

    from toolkit.data.documents import LabelKinds, label_ids

    dtype, suffix = token_dtype(tokenizer.vocab_size)
    path = token_dir() / f"{sha256}-{tokenizer.key}{tag}.{suffix}"
    if (found := open_token_files(path)) is not None:
        return found
    path.parent.mkdir(parents=True, exist_ok=True)
    companions = _companions(path)
    kept = {
        "text": [],
        "instruction": ["starts", "mask"],
        "chat": ["starts", "mask"],
        "preference": ["starts", "mask"],
    }.get(fmt.mode, ["starts", "labels"])
    order = [*kept, "meta", "tokens"]  # renamed in this order: the token file last
    with (
        atomic_files([companions.get(k, path) for k in order]) as opened,
        tqdm(total=total_bytes, unit="B", unit_scale=True, desc=f"tokenizing {shown}", delay=2.0, leave=False) as bar,
    ):
        files = dict(zip(order, opened))
        writer = _Writer(tokenizer, fmt, dtype, files)
        kinds = LabelKinds()
        for records, size, (unit, where) in batches:
            for chunk in _chunks(records, record_text(fmt)):
                if fmt.mode == "labelled":
                    for _, label, number in chunk:
                        kinds.see(label, number, where, unit)
                writer.add(chunk, where)
            bar.update(size)
        if writer.count == 0:
            raise DataFormatError(refused("data", f"{shown} holds no text to train on", "data with some text"))
        meta = {
            "format": asdict(fmt),
            "tokenizer": tokenizer.identity(),
            "source": shown,
            "records": writer.records,
            "tokens": writer.count,
            "bytes": total_bytes,
            "companions": kept,
            "label_names": None,
        }
        if fmt.chat:
            meta["chat_template"] = writer.template.source
        if "starts" in kept:
            files["starts"].write(np.asarray(writer.starts, dtype=np.int64).tobytes())
        if "labels" in kept:
            ids, meta["label_names"] = label_ids(writer.labels)
            files["labels"].write(ids.tobytes())
        files["meta"].write(json.dumps(meta, indent=1).encode())
    return open_token_files(path)


def token_file(asset) -> Path:
    """Byte-level plain text: tokenize a text asset once per content: its files' bytes in file-name order, joined
    by SEPARATOR, in one flat file in the user cache keyed by the content hash (``<sha256>-bytes-v1.u8``). The
    files are the asset's listing for a registered version (from :func:`toolkit.catalogue.data_assets.open_asset`),
    never a walk of its snapshot. Each file is hashed as it is copied, and bytes that are not the ones the asset
    was hashed as are refused, so the tokens are always what the lineage names."""
    from toolkit.catalogue.data_assets import asset_files, check_unchanged

    if not asset.sha256:
        raise ValueError(f"data: {asset.source!r} was opened without hashing; a token file needs its content hash")
    cache = token_dir() / f"{asset.sha256}-{BYTES_KEY}.u8"
    if cache.exists():
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    files = asset_files(asset)
    read = {}
    with atomic_files([cache]) as (out,):
        for i, (name, path) in enumerate(sorted(files)):
            out.write(SEPARATOR if i else b"")
            read[name] = read_hashed(path, out)
        check_unchanged(asset, [{"name": name, "sha256": read[name][0], "size": read[name][1]} for name, _ in files])
    return cache
