"""Datasets and the batch pipeline.

A batch is addressed by its step number: batch ``i`` of rank ``r`` is drawn from a generator seeded by
(seed, r, i). That makes sampling free of Python per-token work, gives every rank its own stream, and means
"the data loader position" is just the step, so a resumed run sees exactly the batches it would have seen.

Three shapes of data, each a Corpus:

    PackedCorpus    documents packed into one token stream (EOS, or SEPARATOR for bytes, between documents); a row
                    is a random window of block_size + 1 tokens
    ExampleCorpus   examples: instruction pairs (labels only on the completion), conversations (labels only on the
                    assistant's tokens), one a row padded to block_size or packed several a row; or labelled texts
                    (one class per row)
    TableCorpus     feature rows and class labels (digits)

Text is tokenized once into memory-mapped token files (toolkit.data.token_files) from its source
(toolkit.data.sources) as toolkit.data.documents reads it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from toolkit.data.batch import ATTENTION_MASK, CHOSEN, IGNORE_INDEX, INPUT_IDS, INPUTS, LABELS, POSITION_IDS, REJECTED
from toolkit.data.documents import SEPARATOR, DataFormat, DataFormatError, data_format
from toolkit.data.shipped import pydoc_documents, pydoc_text, stdlib_documents, stdlib_files, stdlib_text  # noqa: F401
from toolkit.data.token_files import TokenFiles, build_token_files, token_file  # noqa: F401 (token_file: public)
from toolkit.data.tokenizers import ByteTokenizer, load_tokenizer
from toolkit.errors import RefusedValue, not_allowed, refused

VAL_STREAM = 2**31 - 1  # the rank slot of the validation stream, so it never collides with a training rank
EXAMPLE_ORDER_SEED = 0  # examples are shuffled once, the same way everywhere, before the tail is held out


def _generator(seed: int, stream: int, index: int) -> torch.Generator:
    # SeedSequence mixes the three integers properly; adjacent steps get unrelated streams.
    state = np.random.SeedSequence([seed, stream, index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


@dataclass
class Split:
    """One split of a table, as tensors in memory (tables are small)."""

    inputs: torch.Tensor
    targets: torch.Tensor


class Corpus:
    """A dataset with a train and a validation split and a way to draw a batch from either."""

    name: str
    sha256: str
    size_bytes: int
    # UTF-8 bytes per predicted token of the validation split, so val loss converts to bits per byte; None when the
    # data is not text to predict (tables, labelled examples)
    bytes_per_item: float | None = None
    asset: dict | None = None  # the registered data asset it came from (ref, sha256, type), if any
    tokenizer: dict | None = None  # the tokenizer's key, sha256, source and vocab_size (text only)
    label_names: list[str] | None = None  # class names in id order, when the labels were names
    dropped: int = 0  # examples left out: conversations with no assistant token within block_size of their start
    pairs: bool = False  # preference pairs: a batch is two halves, chosen and rejected (toolkit.data.batch)

    def batch(
        self, split: str, batch_size: int, generator: torch.Generator, shard: tuple[int, int] = (0, 1)
    ) -> dict[str, torch.Tensor]:
        """A batch (a dict of tensors, keyed as toolkit.data.batch describes) drawn with ``generator`` from
        ``split``; ``shard`` = (rank, world) restricts it to that rank's disjoint share."""
        raise NotImplementedError

    # data.sampling=epochs: the split as numbered samples, each taken once an epoch (toolkit.data.epochs)
    def sample_count(self, split: str) -> int:
        """The samples of ``split`` an epoch goes through."""
        raise NotImplementedError

    def samples(self, split: str, indices: np.ndarray) -> dict[str, torch.Tensor]:
        """The batch of samples ``indices`` (each in range(sample_count(split))), in that order."""
        raise NotImplementedError


def _shard_range(n: int, shard: tuple[int, int]) -> tuple[int, int]:
    """Rank r of w draws from the r-th of w equal slices: disjoint shares of the data."""
    rank, world = shard
    return n * rank // world, n * (rank + 1) // world


def _draw(n: int, batch_size: int, generator: torch.Generator, shard: tuple[int, int]) -> torch.Tensor:
    low, high = _shard_range(n, shard)
    return torch.randint(low, max(high, low + 1), (batch_size,), generator=generator)


class PackedCorpus(Corpus):
    """Documents as one token stream; a batch is random windows of block_size + 1 tokens (input and shifted
    target). ``byte_lengths`` (UTF-8 bytes per id) sets bits per byte; None: one token is one byte."""

    def __init__(
        self,
        name: str,
        tokens: torch.Tensor,
        sha256: str,
        block_size: int,
        val_fraction: float,
        byte_lengths: np.ndarray | None = None,
        size_bytes: int | None = None,
    ):
        self.name, self.block_size, self.sha256 = name, block_size, sha256
        self.size_bytes = len(tokens) if size_bytes is None else size_bytes
        cut = int(len(tokens) * (1 - val_fraction))  # the tail is held out, never trained on
        self.splits = {"train": tokens[:cut], "val": tokens[cut:]}
        unit = "bytes" if byte_lengths is None else "tokens"
        for split, data in self.splits.items():
            if len(data) <= block_size + 1:
                raise RefusedValue(
                    not_allowed(
                        "model.block_size",
                        block_size,
                        f"< {len(data) - 1}",
                        problem=f"is too long for the {split} split of {name} ({len(data)} {unit})",
                    )
                )
        self.bytes_per_item = 1.0 if byte_lengths is None else bytes_per_token(byte_lengths, self.splits["val"].numpy())
        self._window = torch.arange(block_size + 1)

    @classmethod
    def from_bytes(cls, name: str, text: bytes, block_size: int, val_fraction: float) -> PackedCorpus:
        tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        return cls(name, tokens, hashlib.sha256(text).hexdigest(), block_size, val_fraction)

    def batch(self, split, batch_size, generator, shard=(0, 1)):
        data = self.splits[split]
        starts = _draw(len(data) - self.block_size - 1, batch_size, generator, shard)
        return self._windows(data, starts)

    def _windows(self, data: torch.Tensor, starts: torch.Tensor) -> dict[str, torch.Tensor]:
        chunk = data[starts[:, None] + self._window].long()  # (B, T+1): one gather, no Python loop per token
        return {INPUT_IDS: chunk[:, :-1], LABELS: chunk[:, 1:]}

    def sample_count(self, split):
        """Windows side by side, each block_size + 1 tokens starting where the previous one's input ends: every
        token is predicted once an epoch."""
        return (len(self.splits[split]) - 1) // self.block_size

    def samples(self, split, indices):
        return self._windows(
            self.splits[split], torch.from_numpy(np.asarray(indices, dtype=np.int64)) * self.block_size
        )


def bytes_per_token(byte_lengths: np.ndarray, tokens: np.ndarray) -> float:
    """UTF-8 bytes per token over ``tokens``, counted exactly (each id's bytes), not averaged over a vocabulary."""
    return float(byte_lengths[np.asarray(tokens, dtype=np.int64)].sum()) / max(1, len(tokens))


def fit_example(prompt_len: int, length: int, room: int) -> tuple[int, int]:
    """The slice [start, stop) of an example (its first ``prompt_len`` tokens the prompt, ``length`` in all) that
    fits a row of ``room`` tokens: all of it when it fits; else the completion keeps at least half the row (or all
    of itself, with the prompt's end before it), so every row has completion tokens to learn from."""
    if length <= room:
        return 0, length
    kept_prompt = min(prompt_len, max(room // 2, room - (length - prompt_len)))
    start = prompt_len - kept_prompt
    return start, start + room


def keep_start(length: int, room: int) -> tuple[int, int]:
    """The slice [start, stop) of a conversation that fits a row of ``room`` tokens: its beginning (the system
    prompt and the first turns), as TRL truncates; a conversation with no assistant token in it is dropped."""
    return 0, min(length, room)


class ExampleCorpus(Corpus):
    """Examples, shuffled once (a fixed order) with the tail held out. ``mode``:

        instruction   input_ids, labels on the completion only; rows of block_size
        chat          input_ids, labels on the assistant's tokens; conversations that leave no assistant token in
                      a row are dropped and counted (``self.dropped``)
        preference    pairs of examples (chosen, then rejected: two prompt/answer examples a pair, labels on the
                      answer), drawn by pair into a batch's two halves (toolkit.data.batch CHOSEN, REJECTED)
        labelled      input_ids, attention_mask, one class label a row

    Instruction and chat rows are one example a row padded with pad_id (with an attention_mask), or with ``pack``
    several examples a row, each with its own positions (position_ids restart at 0, which is also what keeps each
    example's attention inside itself: toolkit.train.models) and no padding but at the row's end."""

    def __init__(
        self,
        name: str,
        files: TokenFiles,
        sha256: str,
        block_size: int,
        val_fraction: float,
        pad_id: int,
        byte_lengths: np.ndarray,
        mode: str,
        pack: bool = False,
    ):
        self.name, self.sha256, self.size_bytes = name, sha256, files.meta["bytes"]
        self.block_size, self.pad_id, self.mode, self.pack = block_size, pad_id, mode, pack
        self.labelled = mode == "labelled"
        self.tokens, self.starts, self.mask, self.labels = files.tokens, files.starts, files.mask, files.labels
        self.label_names = files.meta.get("label_names")
        count = len(self.starts) - 1
        self.pairs = mode == "preference"  # the unit drawn, split and counted is then a pair of examples
        order = np.random.default_rng(EXAMPLE_ORDER_SEED).permutation(count // 2 if self.pairs else count)
        if mode == "chat":
            learnable = self._learnable(block_size + 1)
            self.dropped = int(count - learnable.sum())
            order = order[learnable[order]]
            if not len(order):
                raise RefusedValue(
                    not_allowed(
                        "model.block_size",
                        block_size,
                        "enough tokens to reach an assistant turn",
                        problem=f"leaves no assistant token in any of the {count} conversations of {name} (each row "
                        f"keeps a conversation's first {block_size} tokens)",
                    )
                )
        cut = int(len(order) * (1 - val_fraction))
        if cut < 1 or cut == len(order):
            raise RefusedValue(
                not_allowed(
                    "data.val_fraction",
                    val_fraction,
                    "a share that leaves examples in both splits (or more examples)",
                    problem=f"splits the {len(order)} {'pairs' if self.pairs else 'examples'} of {name} into {cut} "
                    f"and {len(order) - cut}"
                    + (
                        f" ({self.dropped} more dropped: nothing to learn from in {block_size} tokens)"
                        if self.dropped
                        else ""
                    ),
                )
            )
        self.splits = {"train": order[:cut], "val": order[cut:]}
        if not self.labelled:
            in_val = np.zeros(count, dtype=bool)
            val = self.splits["val"]
            in_val[np.concatenate([2 * val, 2 * val + 1]) if self.pairs else val] = True
            counted = np.repeat(in_val, np.diff(self.starts)) & (self.mask == 1)
            self.bytes_per_item = bytes_per_token(byte_lengths, self.tokens[counted])

    def _learnable(self, room: int) -> np.ndarray:
        """Per example: does its row (its first ``room`` tokens) hold a token the loss counts? Labels are shifted
        by one, so a counted first token teaches nothing."""
        counted_at = np.flatnonzero(self.mask)
        begin, end = self.starts[:-1], np.minimum(self.starts[1:], self.starts[:-1] + room)
        first = np.searchsorted(counted_at, begin + 1)
        return (first < len(counted_at)) & (counted_at[np.minimum(first, len(counted_at) - 1)] < end)

    def check_labels(self, num_labels: int) -> None:
        """Refuse labels the classifier has no output for."""
        top = int(self.labels.max())
        if top >= num_labels:
            seen = (
                f"{len(self.label_names)} class names ({', '.join(self.label_names[:5])}"
                f"{', ...' if len(self.label_names) > 5 else ''})"
                if self.label_names
                else f"class {top}"
            )
            raise DataFormatError(
                not_allowed(
                    "model.hf.num_labels",
                    num_labels,
                    f"{top + 1} or more",
                    problem=f"is too few for {self.name}, which has {seen}",
                )
            )

    def _slice(self, i: int, room: int, kept_prompt: int | None = None) -> tuple[int, int]:
        """Where example ``i``'s tokens that fit ``room`` lie in the token file; ``kept_prompt``: keep at most that
        many of its prompt's last tokens (a pair's two answers read the same prompt)."""
        first, end = int(self.starts[i]), int(self.starts[i + 1])
        if self.mode in ("instruction", "preference"):
            prompt_len = int(np.argmax(self.mask[first:end]))  # the first counted token ends the prompt
            start, stop = fit_example(prompt_len, end - first, room)
            if kept_prompt is not None and prompt_len - start > kept_prompt:
                start = prompt_len - kept_prompt
                stop = min(start + room, end - first)
        else:  # a text keeps its beginning, as does a conversation
            start, stop = keep_start(end - first, room)
        return first + start, first + stop

    def _rows(
        self, examples: np.ndarray, room: int, kept_prompt: list[int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, counted, valid), each (B, room): the examples cut to fit (each keeping at most ``kept_prompt[row]``
        prompt tokens, when given), padded with pad_id at the end."""
        ids = np.full((len(examples), room), self.pad_id, dtype=np.int64)
        counted = np.zeros((len(examples), room), dtype=bool)
        valid = np.zeros((len(examples), room), dtype=bool)
        for row, i in enumerate(examples):
            begin, end = self._slice(int(i), room, None if kept_prompt is None else kept_prompt[row])
            ids[row, : end - begin] = self.tokens[begin:end]
            counted[row, : end - begin] = self.mask[begin:end] == 1 if not self.labelled else False
            valid[row, : end - begin] = True
        return torch.from_numpy(ids), torch.from_numpy(counted), torch.from_numpy(valid)

    def packed_rows(self, examples: Iterable[int], rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list]:
        """(ids, counted, positions), each (rows, block_size + 1), and the examples placed: ``examples`` taken one
        after another, each into the current row when it fits and else into the next (so a row wastes less than one
        example); positions count from 0 within each example. Padding at a row's end is position 0 at every token:
        each pad token is an example of its own, attending only to itself, and no label counts there."""
        room = self.block_size + 1
        ids = np.full((rows, room), self.pad_id, dtype=np.int64)
        counted = np.zeros((rows, room), dtype=bool)
        positions = np.zeros((rows, room), dtype=np.int64)
        placed: list[int] = []
        row, used = 0, 0
        for i in examples:
            begin, end = self._slice(i, room)
            length = end - begin
            if used + length > room:
                row, used = row + 1, 0
                if row == rows:
                    break
            ids[row, used : used + length] = self.tokens[begin:end]
            counted[row, used + 1 : used + length] = self.mask[begin + 1 : end] == 1  # never across two examples
            positions[row, used : used + length] = np.arange(length)
            placed.append(i)
            used += length
        return torch.from_numpy(ids), torch.from_numpy(counted), torch.from_numpy(positions), placed

    def _drawn(self, split: str, generator, shard, bulk: int) -> Iterator[int]:
        """Examples of ``split`` drawn at random without end, ``bulk`` at a time (the same generator, the same
        examples)."""
        pool = self.splits[split]
        while True:
            yield from pool[_draw(len(pool), bulk, generator, shard).numpy()].tolist()

    def batch(self, split, batch_size, generator, shard=(0, 1)):
        if self.pack:
            ids, counted, positions, _ = self.packed_rows(
                self._drawn(split, generator, shard, 4 * batch_size), batch_size
            )
            labels = torch.where(counted[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], IGNORE_INDEX))
            return {INPUT_IDS: ids[:, :-1], LABELS: labels, POSITION_IDS: positions[:, :-1]}
        return self._examples(self.splits[split][_draw(len(self.splits[split]), batch_size, generator, shard).numpy()])

    def sample_count(self, split):
        return len(self.splits[split])  # examples; packed rows take a varying number of them a row (refused)

    def samples(self, split, indices):
        return self._examples(self.splits[split][np.asarray(indices, dtype=np.int64)])

    def _examples(self, examples: np.ndarray) -> dict[str, torch.Tensor]:
        """The batch of ``examples`` (their numbers), one a row (two, chosen and rejected, for pairs)."""
        if self.pairs:  # the examples drawn are pairs: 2i chosen, 2i + 1 rejected, reading the same prompt tokens
            kept = [min(self._prompt_kept(2 * i), self._prompt_kept(2 * i + 1)) for i in examples.tolist()]
            halves = (self._text_batch(2 * examples, kept), self._text_batch(2 * examples + 1, kept))
            return {
                prefix + key: value for prefix, half in zip((CHOSEN, REJECTED), halves) for key, value in half.items()
            }
        if self.labelled:
            ids, _, valid = self._rows(examples, self.block_size)
            return {
                INPUT_IDS: ids,
                ATTENTION_MASK: valid.long(),
                LABELS: torch.from_numpy(np.asarray(self.labels[examples], dtype=np.int64)),
            }
        return self._text_batch(examples)

    def _prompt_kept(self, i: int) -> int:
        """How many of example ``i``'s prompt tokens its row keeps (fit_example)."""
        begin, _ = self._slice(i, self.block_size + 1)
        return int(np.argmax(self.mask[int(self.starts[i]) : int(self.starts[i + 1])])) - (begin - int(self.starts[i]))

    def _text_batch(self, examples: np.ndarray, kept_prompt: list[int] | None = None) -> dict:
        """``examples`` one a row, padded, labels where the loss counts."""
        ids, counted, valid = self._rows(examples, self.block_size + 1, kept_prompt)
        labels = torch.where(counted[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], IGNORE_INDEX))
        return {INPUT_IDS: ids[:, :-1], LABELS: labels, ATTENTION_MASK: valid[:, :-1].long()}


class TableCorpus(Corpus):
    """Feature rows with class labels; a batch is rows drawn with replacement."""

    def __init__(self, name: str, features: np.ndarray, labels: np.ndarray, val_fraction: float, seed: int = 0):
        order = np.random.default_rng(seed).permutation(len(labels))  # fixed shuffle, then hold out the tail
        features, labels = features[order], labels[order]
        cut = int(len(labels) * (1 - val_fraction))
        self.name = name
        raw = features.astype(np.float32).tobytes() + labels.astype(np.int64).tobytes()
        self.sha256, self.size_bytes = hashlib.sha256(raw).hexdigest(), len(raw)
        x, y = torch.tensor(features, dtype=torch.float32), torch.tensor(labels, dtype=torch.long)
        self.splits = {"train": Split(x[:cut], y[:cut]), "val": Split(x[cut:], y[cut:])}

    def batch(self, split, batch_size, generator, shard=(0, 1)):
        data = self.splits[split]
        rows = _draw(len(data.targets), batch_size, generator, shard)
        return {INPUTS: data.inputs[rows], LABELS: data.targets[rows]}

    def sample_count(self, split):
        return len(self.splits[split].targets)

    def samples(self, split, indices):
        rows = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        data = self.splits[split]
        return {INPUTS: data.inputs[rows], LABELS: data.targets[rows]}


def _tokenized(cfg, fmt: DataFormat, source, tokenizer, name: str) -> Corpus:
    """A corpus from a source's token files (built on first use) for ``tokenizer``."""
    if fmt.chat:  # conversations (or preference prompts' turns): the template is part of what the token files hold
        from toolkit.data.chat import ChatTemplate

        fmt = dataclasses.replace(fmt, template_sha256=ChatTemplate(tokenizer).sha256)
    files = build_token_files(
        source.sha256, tokenizer, fmt, fmt.tag(source.has_jsonl), source.batches(fmt), source.size_bytes, source.name
    )
    if fmt.mode == "text":
        lengths = None if isinstance(tokenizer, ByteTokenizer) else tokenizer.byte_lengths()  # None: 1 byte a token
        return PackedCorpus(
            name,
            torch.from_numpy(files.tokens),
            source.sha256,
            cfg.model.block_size,
            cfg.data.val_fraction,
            lengths,
            size_bytes=source.size_bytes,
        )
    corpus = ExampleCorpus(
        name,
        files,
        source.sha256,
        cfg.model.block_size,
        cfg.data.val_fraction,
        tokenizer.pad_id,
        tokenizer.byte_lengths(),
        mode=fmt.mode,
        pack=cfg.data.pack,
    )
    if fmt.mode == "labelled":
        corpus.check_labels(cfg.model.hf.num_labels)
    return corpus


def _builtin_text(name: str, documents: Callable[[], list[bytes]]) -> Callable:
    def load(cfg) -> Corpus:
        from toolkit.data.sources import builtin_source

        fmt = data_format(cfg)
        if fmt.mode != "text":
            raise DataFormatError(
                refused(
                    "data.dataset",
                    f"{name!r} is plain text; {fmt.mode} data needs its own examples",
                    "data.asset or data.path with JSON Lines",
                )
            )
        tokenizer = load_tokenizer(cfg)
        docs = documents()
        text = SEPARATOR.join(docs)
        if isinstance(tokenizer, ByteTokenizer):
            corpus = PackedCorpus.from_bytes(name, text, cfg.model.block_size, cfg.data.val_fraction)
        else:
            corpus = _tokenized(cfg, fmt, builtin_source(name, docs, hashlib.sha256(text).hexdigest()), tokenizer, name)
        corpus.tokenizer = tokenizer.identity()
        return corpus

    return load


def _load_digits(cfg) -> Corpus:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return TableCorpus("digits", digits.data / 16.0, digits.target, cfg.data.val_fraction)


DATASETS: dict[str, Callable] = {
    "pydoc": _builtin_text("pydoc", pydoc_documents),
    "stdlib": _builtin_text("stdlib", stdlib_documents),
    "digits": _load_digits,
}


def _text_asset(asset, cfg, fmt: DataFormat, ref: str) -> Corpus:
    from toolkit.data.sources import asset_source, table_source

    tokenizer = load_tokenizer(cfg)
    if asset.type == "mltable":
        if fmt.mode != "labelled":
            raise DataFormatError(
                refused(
                    "data",
                    f"{ref} is a table (mltable); {fmt.mode} data is read from files",
                    "uri_file or uri_folder assets of text or JSON Lines",
                )
            )
        source = table_source(asset, ref)
    else:
        source = asset_source(asset, ref)
    if fmt.mode == "text" and isinstance(tokenizer, ByteTokenizer) and not source.has_jsonl:
        tokens = torch.from_numpy(np.memmap(token_file(asset), dtype=np.uint8, mode="c"))
        corpus = PackedCorpus(asset.ref, tokens, asset.sha256, cfg.model.block_size, cfg.data.val_fraction)
    else:
        corpus = _tokenized(cfg, fmt, source, tokenizer, asset.ref)
    corpus.tokenizer = tokenizer.identity()
    return corpus


def _table_asset(asset, cfg) -> Corpus:
    from toolkit.catalogue.mltable import load_mltable

    frame = load_mltable(asset.path)
    if "label" not in frame.columns:
        raise RefusedValue(refused("data.asset", f"{asset.ref} has no 'label' column", "a table with a label column"))
    features = frame.drop(columns=["label"]).to_numpy(dtype=np.float32)
    scale = float(np.abs(features).max()) or 1.0  # e.g. digits' 0-16 pixel values -> 0-1
    return TableCorpus(asset.ref, features / scale, frame["label"].to_numpy(), cfg.data.val_fraction)


def load_corpus(cfg) -> Corpus:
    """The file or folder at data.path, else the registered asset named by data.asset (pinned to a version at
    launch), else a built-in dataset. Text of any kind is tokenized by data.tokenizer; a table trains a feature
    model, or a sequence classifier on its text and label columns."""
    from toolkit.catalogue import data_assets

    if cfg.data.path:
        asset = data_assets.open_path(cfg.data.path)
    elif cfg.data.asset:
        from toolkit.catalogue.workspace import Workspace

        # open_asset, not get: the listing comes along, so only the registered files are read
        asset = data_assets.open_asset(Workspace.open(cfg.data.workspace or None), cfg.data.asset)
    else:
        return DATASETS[cfg.data.dataset](cfg)
    ref = asset.source if cfg.data.path else asset.ref
    fmt = data_format(cfg)
    if asset.type == "mltable" and fmt.mode == "text":
        corpus = _table_asset(asset, cfg)
    else:
        corpus = _text_asset(asset, cfg, fmt, ref)
    corpus.asset = {"ref": ref, "sha256": asset.sha256, "type": asset.type}
    return corpus


class StepBatches(Dataset):
    """Training batch number ``step`` for one rank: a pure function of (seed, rank, step)."""

    def __init__(self, corpus: Corpus, batch_size: int, seed: int, rank: int, world_size: int = 1):
        self.corpus, self.batch_size, self.seed, self.rank, self.world_size = corpus, batch_size, seed, rank, world_size

    def __len__(self):
        return 2**62

    def __getitem__(self, step):
        return self.corpus.batch(
            "train", self.batch_size, _generator(self.seed, self.rank, step), shard=(self.rank, self.world_size)
        )


def train_loader(corpus: Corpus, cfg, rank: int, first_step: int, world_size: int = 1, position: int = 0) -> DataLoader:
    """Batches for steps first_step .. max_steps - 1 of data-parallel replica ``rank`` of ``world_size``, prepared by
    cfg.data.num_workers processes. A step's batch holds all its micro-batches (batch_size x grad_accum_steps rows,
    split by the trainer), drawn at once: so 4 x 8 and 1 x 32 train on the same 32 rows, and an accumulated run
    equals the unaccumulated one. ``position``: data.sampling=epochs, the samples all replicas took before
    first_step (toolkit.data.epochs)."""
    workers = cfg.data.num_workers
    rows = cfg.train.batch_size * cfg.train.grad_accum_steps
    if cfg.data.sampling == "epochs":
        from toolkit.data.epochs import EpochBatches

        batches: Dataset = EpochBatches(corpus, rows, cfg.train.seed, rank, world_size, first_step, position)
    else:
        batches = StepBatches(corpus, rows, cfg.train.seed, rank, world_size)
    return DataLoader(
        batches,
        batch_size=None,  # each item is already a whole batch
        sampler=range(first_step, cfg.train.max_steps),
        num_workers=workers,
        prefetch_factor=cfg.data.prefetch_factor if workers else None,
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),
    )


def val_batches(corpus: Corpus, cfg, rank: int, world_size: int):
    """This rank's share of the fixed validation batches (the same batches at every evaluation), each of a training
    step's rows (batch_size x grad_accum_steps): the same validation set however a step is split."""
    for i in range(rank, cfg.train.eval_batches, world_size):
        yield val_batch(corpus, cfg, i)


def val_batch(corpus: Corpus, cfg, i: int) -> dict:
    """Validation batch number ``i`` (a pure function of the seed and i)."""
    rows = cfg.train.batch_size * cfg.train.grad_accum_steps
    return corpus.batch("val", rows, _generator(cfg.train.seed, VAL_STREAM, i))


def bits_per_byte(loss_nats: float, corpus: Corpus) -> float | None:
    """Validation loss (nats per predicted token) as bits per UTF-8 byte: loss / ln 2 x tokens per byte of the
    validation split (1 for bytes)."""
    if corpus.bytes_per_item is None:
        return None
    return loss_nats / math.log(2) / corpus.bytes_per_item
