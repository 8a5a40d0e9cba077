"""Built-in datasets and the batch pipeline.

A batch is addressed by its step number: batch ``i`` of rank ``r`` is drawn from a generator seeded by
(seed, r, i). That makes sampling free of Python per-token work, gives every rank its own stream, and means
"the data loader position" is just the step, so a resumed run sees exactly the batches it would have seen.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from toolkit import paths
from toolkit.data.batch import INPUT_IDS, INPUTS, LABELS
from toolkit.data.tokenizers import BYTES_KEY
from toolkit.errors import not_allowed, refused


SEPARATOR = b"\n\n"  # between two files of a folder asset
VAL_STREAM = 2**31 - 1  # the rank slot of the validation stream, so it never collides with a training rank


def _generator(seed: int, stream: int, index: int) -> torch.Generator:
    # SeedSequence mixes the three integers properly; adjacent steps get unrelated streams.
    state = np.random.SeedSequence([seed, stream, index]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


@dataclass
class Split:
    """One split of a dataset, as tensors in memory (the built-ins are small)."""

    inputs: torch.Tensor  # bytes (text) or feature rows (tables)
    targets: torch.Tensor | None  # None for text: targets are the inputs shifted by one


class Corpus:
    """A dataset with a train and a validation split and a way to draw a batch from either."""

    name: str
    sha256: str
    size_bytes: int
    bytes_per_item: float | None = None  # set for byte-level text, so val loss converts to bits per byte
    asset: dict | None = None  # the registered data asset it came from (ref, sha256, type), if any

    def batch(self, split: str, batch_size: int, generator: torch.Generator,
              shard: tuple[int, int] = (0, 1)) -> dict[str, torch.Tensor]:
        """A batch (a dict of tensors, keyed as toolkit.train.models describes) drawn with ``generator`` from
        ``split``; ``shard`` = (rank, world) restricts it to that rank's disjoint share."""
        raise NotImplementedError


def _shard_range(n: int, shard: tuple[int, int]) -> tuple[int, int]:
    """Rank r of w draws from the r-th of w equal slices: disjoint shares of the data."""
    rank, world = shard
    return n * rank // world, n * (rank + 1) // world


class ByteCorpus(Corpus):
    """Text as raw bytes; a batch is random windows of block_size + 1 bytes (input and shifted target)."""

    bytes_per_item = 1.0

    def __init__(self, name: str, tokens: torch.Tensor, sha256: str, block_size: int, val_fraction: float):
        self.name, self.block_size, self.sha256, self.size_bytes = name, block_size, sha256, len(tokens)
        cut = int(len(tokens) * (1 - val_fraction))  # the tail is held out, never trained on
        self.splits = {"train": tokens[:cut], "val": tokens[cut:]}
        for split, data in self.splits.items():
            if len(data) <= block_size + 1:
                raise ValueError(
                    not_allowed("model.block_size", block_size, f"< {len(data) - 1}",
                                problem=f"is too long for the {split} split of {name} ({len(data)} bytes)"))
        self._window = torch.arange(block_size + 1)

    @classmethod
    def from_bytes(cls, name: str, text: bytes, block_size: int, val_fraction: float) -> "ByteCorpus":
        tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8)
        return cls(name, tokens, hashlib.sha256(text).hexdigest(), block_size, val_fraction)

    def batch(self, split, batch_size, generator, shard=(0, 1)):
        data = self.splits[split]
        low, high = _shard_range(len(data) - self.block_size - 1, shard)
        starts = torch.randint(low, max(high, low + 1), (batch_size,), generator=generator)
        chunk = data[starts[:, None] + self._window].long()  # (B, T+1): one gather, no Python loop per token
        return {INPUT_IDS: chunk[:, :-1], LABELS: chunk[:, 1:]}


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
        low, high = _shard_range(len(data.targets), shard)
        rows = torch.randint(low, max(high, low + 1), (batch_size,), generator=generator)
        return {INPUTS: data.inputs[rows], LABELS: data.targets[rows]}


def pydoc_text() -> bytes:
    """CPython's own documentation (pydoc_data.topics, ~466 kB of English and code), in a fixed order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics)).encode("utf-8")


def stdlib_files() -> list[Path]:
    """The standard library's own .py sources, in a fixed order: a real code corpus in every Python (tests,
    third-party site-packages and IDLE left out)."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__", "lib2to3"}
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if d not in skip]  # pruned, not walked: site-packages is large
        found += [Path(folder) / n for n in names if n.endswith(".py")]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def stdlib_text() -> bytes:
    """The files of :func:`stdlib_files`, each preceded by a '# file: NAME' line, joined by SEPARATOR (~20 MB)."""
    root = Path(__import__("sysconfig").get_paths()["stdlib"])
    return SEPARATOR.join(b"# file: " + p.relative_to(root).as_posix().encode() + b"\n" + p.read_bytes()
                          for p in stdlib_files())


def _load_pydoc(cfg) -> Corpus:
    return ByteCorpus.from_bytes("pydoc", pydoc_text(), cfg.model.block_size, cfg.data.val_fraction)


def _load_stdlib(cfg) -> Corpus:
    return ByteCorpus.from_bytes("stdlib", stdlib_text(), cfg.model.block_size, cfg.data.val_fraction)


def _load_digits(cfg) -> Corpus:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return TableCorpus("digits", digits.data / 16.0, digits.target, cfg.data.val_fraction)


DATASETS: dict[str, Callable] = {"pydoc": _load_pydoc, "stdlib": _load_stdlib, "digits": _load_digits}


def token_file(asset) -> Path:
    """Tokenize a text asset once per content: its files' bytes in file-name order, joined by SEPARATOR, in one
    flat file in the user cache keyed by the content hash and the tokenizer (never beside the data: not in a
    snapshot, not in the user's folder), written atomically. The files are the asset's listing for a registered
    version (from :func:`toolkit.catalogue.data_assets.open_asset`), never a walk of its snapshot. Each file is hashed as it
    is copied, and bytes that are not the ones the asset was hashed as are refused, so the tokens are always what
    the lineage names."""
    import uuid

    from toolkit.catalogue.data_assets import asset_files, check_unchanged
    from toolkit.fsio import read_hashed

    if not asset.sha256:
        raise ValueError(f"data: {asset.source!r} was opened without hashing; a token file needs its content hash")
    cache = paths.cache_dir() / "tokens" / f"{asset.sha256}-{BYTES_KEY}.u8"
    if cache.exists():
        return cache
    cache.parent.mkdir(parents=True, exist_ok=True)
    files = asset_files(asset)
    tmp = cache.with_name(f".{cache.name}.{uuid.uuid4().hex}.tmp")
    try:
        read = {}
        with open(tmp, "xb") as out:
            for i, (name, path) in enumerate(sorted(files)):
                out.write(SEPARATOR if i else b"")
                read[name] = read_hashed(path, out)
        check_unchanged(asset, [{"name": name, "sha256": read[name][0], "size": read[name][1]} for name, _ in files])
        os.replace(tmp, cache)
    finally:
        tmp.unlink(missing_ok=True)
    return cache


def _text_asset(asset, cfg) -> Corpus:
    # Memory-mapped: ranks and DataLoader workers share the page cache instead of each holding a copy.
    # mode="c" (copy-on-write) gives torch a writable view without ever writing to the file.
    tokens = torch.from_numpy(np.memmap(token_file(asset), dtype=np.uint8, mode="c"))
    return ByteCorpus(asset.ref, tokens, asset.sha256, cfg.model.block_size, cfg.data.val_fraction)


def _table_asset(asset, cfg) -> Corpus:
    from toolkit.catalogue.mltable import load_mltable

    frame = load_mltable(asset.path)
    if "label" not in frame.columns:
        raise ValueError(refused("data.asset", f"{asset.ref} has no 'label' column", "a table with a label column"))
    features = frame.drop(columns=["label"]).to_numpy(dtype=np.float32)
    scale = float(np.abs(features).max()) or 1.0  # e.g. digits' 0-16 pixel values -> 0-1
    return TableCorpus(asset.ref, features / scale, frame["label"].to_numpy(), cfg.data.val_fraction)


ASSET_LOADERS: dict[str, Callable] = {"uri_file": _text_asset, "uri_folder": _text_asset, "mltable": _table_asset}


def load_corpus(cfg) -> Corpus:
    """The file or folder at data.path, else the registered asset named by data.asset (pinned to a version at
    launch), else a built-in dataset."""
    from toolkit.catalogue import data_assets

    if cfg.data.path:
        asset = data_assets.open_path(cfg.data.path)
    elif cfg.data.asset:
        from toolkit.catalogue.workspace import Workspace

        # open_asset, not get: the listing comes along, so only the registered files are read
        asset = data_assets.open_asset(Workspace.open(cfg.data.workspace or None), cfg.data.asset)
    else:
        return DATASETS[cfg.data.dataset](cfg)
    corpus = ASSET_LOADERS[asset.type](asset, cfg)
    corpus.asset = {"ref": asset.source if cfg.data.path else asset.ref, "sha256": asset.sha256, "type": asset.type}
    return corpus


class StepBatches(Dataset):
    """Training batch number ``step`` for one rank: a pure function of (seed, rank, step)."""

    def __init__(self, corpus: Corpus, batch_size: int, seed: int, rank: int, world_size: int = 1):
        self.corpus, self.batch_size, self.seed, self.rank, self.world_size = corpus, batch_size, seed, rank, world_size

    def __len__(self):
        return 2**62

    def __getitem__(self, step):
        return self.corpus.batch("train", self.batch_size, _generator(self.seed, self.rank, step),
                                 shard=(self.rank, self.world_size))


def train_loader(corpus: Corpus, cfg, rank: int, first_step: int, world_size: int = 1) -> DataLoader:
    """Batches for steps first_step .. max_steps - 1, prepared by cfg.data.num_workers processes."""
    workers = cfg.data.num_workers
    return DataLoader(
        StepBatches(corpus, cfg.train.batch_size, cfg.train.seed, rank, world_size),
        batch_size=None,  # each item is already a whole batch
        sampler=range(first_step, cfg.train.max_steps),
        num_workers=workers,
        prefetch_factor=cfg.data.prefetch_factor if workers else None,
        persistent_workers=workers > 0,
        pin_memory=torch.cuda.is_available(),
    )


def val_batches(corpus: Corpus, cfg, rank: int, world_size: int):
    """This rank's share of the fixed validation batches (the same batches at every evaluation)."""
    for i in range(rank, cfg.train.eval_batches, world_size):
        yield corpus.batch("val", cfg.train.batch_size, _generator(cfg.train.seed, VAL_STREAM, i))


def bits_per_byte(loss_nats: float, corpus: Corpus) -> float | None:
    if corpus.bytes_per_item is None:
        return None
    return loss_nats / math.log(2) / corpus.bytes_per_item
