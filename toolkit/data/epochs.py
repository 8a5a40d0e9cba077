"""data.sampling=epochs: every training sample once an epoch, in a seeded order, and a position that survives a
change in the number of data-parallel replicas.

The samples of the training split are numbered 0 .. n-1 (Corpus.sample_count). Epoch e visits them in the order
permutation(n, seed, e), and the epochs follow one another: position q of the run is sample order_e[q mod n] with
e = q // n. A step takes the next ``replicas x rows`` positions, replica r the r-th slice of ``rows``:

    step s (after ``first_step`` at ``position``):  positions  position + (s - first_step) x replicas x rows  + r x rows
                                                               ... + rows - 1

The position is a count of samples, not of steps: a checkpoint keeps it (trainer state ``samples_seen``), and a run
resumed with another number of replicas goes on from it, so across the change no sample is seen twice or skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from toolkit.data.batch import SAMPLE_IDS
from toolkit.errors import not_allowed
from toolkit.fsio import open_log, read_regular_file

ORDER_STREAM = 3  # keeps an epoch's order apart from the other uses of train.seed


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order of the n samples in ``epoch``: a permutation, a pure function of (seed, epoch)."""
    return np.random.default_rng([seed, ORDER_STREAM, epoch]).permutation(n)


class EpochBatches(Dataset):
    """Training batch number ``step`` for one replica, by the arithmetic above. Each batch carries its rows' sample
    numbers (SAMPLE_IDS)."""

    def __init__(self, corpus, rows: int, seed: int, replica: int, replicas: int, first_step: int, position: int):
        self.corpus, self.rows, self.seed = corpus, rows, seed
        self.replica, self.replicas, self.first_step, self.position = replica, replicas, first_step, position
        self.n = corpus.sample_count("train")
        self._order: tuple[int, np.ndarray] | None = None  # the epoch whose order is at hand

    def __len__(self):
        return 2**62

    def start(self, step: int) -> int:
        """This replica's first position in ``step``."""
        return self.position + (step - self.first_step) * self.replicas * self.rows + self.replica * self.rows

    def sample_ids(self, step: int) -> np.ndarray:
        positions = np.arange(self.start(step), self.start(step) + self.rows)
        ids = np.empty(self.rows, dtype=np.int64)
        for epoch in np.unique(positions // self.n):  # a step may straddle two epochs
            if self._order is None or self._order[0] != epoch:
                self._order = (int(epoch), epoch_order(self.seed, int(epoch), self.n))
            here = positions // self.n == epoch
            ids[here] = self._order[1][positions[here] % self.n]
        return ids

    def __getitem__(self, step):
        ids = self.sample_ids(step)
        import torch

        return {**self.corpus.samples("train", ids), SAMPLE_IDS: torch.from_numpy(ids)}


class SampleRecord:
    """data.record_samples: the first rank of each replica appends one JSON line a step to
    RUN_DIR/samples/replica_R.jsonl, {"step", "started", "samples"}, ``started`` the time its training processes
    started (the same on every rank). A step trained again after a restart (or a change of nodes) is written again
    by the later processes: for each step, the lines with the latest ``started`` are what the run kept
    (:func:`kept_samples`)."""

    def __init__(self, run_dir: Path, replica: int, started: float):
        folder = run_dir / "samples"
        if folder.is_symlink():  # a copied run directory's link would lead the records out of it
            raise OSError(not_allowed("samples", folder, "a folder of the run directory", problem="is a link"))
        folder.mkdir(exist_ok=True)
        # a link at the file is refused, never written through (fsio.open_log); line-buffered: a line a step
        self.file = open_log(folder / f"replica_{replica:05d}.jsonl", text=True)
        self.started = started

    def write(self, step: int, ids) -> None:
        self.file.write(json.dumps({"step": step, "started": self.started, "samples": ids.tolist()}) + "\n")

    def close(self) -> None:
        self.file.close()


def kept_samples(run_dir: Path) -> dict[int, list[int]]:
    """step -> the samples the run kept for it (every replica's, in replica order): of the lines written for a step,
    those of the latest processes to train it (SampleRecord)."""
    lines: dict[int, dict[float, dict[int, list[int]]]] = {}
    for path in sorted((run_dir / "samples").glob("replica_*.jsonl")):
        replica = int(path.stem.removeprefix("replica_"))
        text = read_regular_file(path, field="samples", error=ValueError).decode("utf-8")
        for line in text.splitlines():
            entry = json.loads(line)
            lines.setdefault(entry["step"], {}).setdefault(entry["started"], {})[replica] = entry["samples"]
    kept = {}
    for step, by_start in lines.items():
        latest = by_start[max(by_start)]
        kept[step] = [sample for replica in sorted(latest) for sample in latest[replica]]
    return dict(sorted(kept.items()))
