"""The loading advisor: which DataLoader setting keeps the model from waiting for data, measured, not guessed.

For each (num_workers, prefetch_factor) in a small grid, run real training steps of the configured model and
time how long each step waits for its batch (as the trainer's data_wait_pct does). Recommend the cheapest
setting (fewest workers, then least prefetch) whose wait stays under the target, and warn about the traps of
the Azure ML data-loading guide that can be seen from here: many small files, a /dev/shm too small for the
workers, deep folder trees.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.machine import shm_shortfall
from toolkit.tables import Column, text_table

SMALL_FILE_BYTES = 4 << 20  # the guide's threshold: below ~4 MB per file, per-file overhead dominates reads
SMALL_FILES_WARN = 100
DEEP_TREE_LEVELS = 4
DEFAULT_GRID = ((0, 2), (1, 2), (2, 2), (2, 4))


@dataclass
class Trial:
    num_workers: int
    prefetch_factor: int
    wait_pct: float  # time blocked on the next batch, % of step time, with the model training
    step_ms: float  # median training step, data included
    loader_batches_per_s: float  # the loader alone, nothing else running

    @property
    def headroom(self) -> float:
        """How many times faster the loader makes batches than the model consumes them."""
        return self.loader_batches_per_s * self.step_ms / 1e3


@dataclass
class TuneReport:
    asset: str
    trials: list[Trial]
    recommended: Trial | None
    target_pct: float
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"data loading for {self.asset} (target: wait < {self.target_pct:g}% of step time)",
            text_table(
                self.trials,
                [
                    Column("workers", "num_workers", right=True),
                    Column("prefetch", "prefetch_factor", right=True),
                    Column("wait %", "wait_pct", ".2f", right=True),
                    Column("step ms", "step_ms", ".1f", right=True),
                    Column("loader batch/s", "loader_batches_per_s", ",.0f", right=True),
                    Column("headroom", lambda t: f"{t.headroom:,.0f}x", right=True),
                    Column("", lambda t: "<- recommended" if t is self.recommended else ""),
                ],
                indent="  ",
            ),
        ]
        if self.recommended is None:
            lines.append("  no setting met the target: the data path, not the loader, is the bottleneck")
        else:
            lines.append(
                f"  set data.num_workers={self.recommended.num_workers} "
                f"data.prefetch_factor={self.recommended.prefetch_factor}"
            )
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def layout_warnings(path: Path, num_workers: int, batch_bytes: int, prefetch: int) -> list[str]:
    warnings = []
    files = [p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")] if path.is_dir() else [path]
    small = [p for p in files if p.stat().st_size < SMALL_FILE_BYTES]
    if len(small) >= SMALL_FILES_WARN:
        warnings.append(
            f"{len(small):,} of {len(files):,} files are under 4 MB: per-file overhead will dominate "
            "reads from network storage; pack them (one token file, tar shards or Parquet)"
        )
    if path.is_dir():
        depth = max((len(p.relative_to(path).parts) for p in files), default=0)
        if depth > DEEP_TREE_LEVELS:
            warnings.append(
                f"files sit {depth} folders deep: listing a deep tree is slow on blob storage; "
                "flatten it or keep an index file"
            )
    shortfall = shm_shortfall(num_workers, prefetch, batch_bytes)
    return warnings + ([shortfall] if shortfall else [])


def _measure(cfg, corpus, steps: int) -> Trial:
    """Real training steps, single process; wait = time blocked in next(batch)."""
    import torch

    from toolkit.data import corpus as data_mod
    from toolkit.train.distributed import Topology
    from toolkit.train.engines.torch_engine import TorchEngine
    from toolkit.train.models import build_model, loss_function
    from toolkit.train.trainer import train_step

    torch.manual_seed(cfg.train.seed)
    engine = TorchEngine(build_model(cfg.model), cfg, Topology(0, 0, 1, torch.device("cpu")), loss_function(cfg.model))
    loader = iter(data_mod.train_loader(corpus, cfg, rank=0, first_step=0))
    waits, totals = [], []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        batch = next(loader)
        t1 = time.perf_counter()
        train_step(engine, [batch])
        if i >= 3:  # the first batches include worker start-up
            waits.append(t1 - t0)
            totals.append(time.perf_counter() - t0)
    del loader
    alone = iter(data_mod.train_loader(corpus, cfg, rank=0, first_step=0))
    next(alone)  # worker start-up is not throughput
    t0 = time.perf_counter()
    for _ in range(steps):
        next(alone)
    loader_rate = steps / (time.perf_counter() - t0)
    del alone
    return Trial(
        cfg.data.num_workers,
        cfg.data.prefetch_factor,
        100 * sum(waits) / sum(totals),
        1e3 * statistics.median(totals),
        loader_rate,
    )


def tune(cfg, grid=DEFAULT_GRID, steps: int = 20, target_pct: float = 2.0) -> TuneReport:
    """Measure each setting of ``grid`` on ``cfg``'s model and data; recommend the cheapest under target."""
    import torch

    from toolkit.data import corpus as data_mod

    corpus = data_mod.load_corpus(cfg)
    trials = []
    for workers, prefetch in grid:
        trial_cfg = dataclasses.replace(
            cfg,
            data=dataclasses.replace(cfg.data, num_workers=workers, prefetch_factor=prefetch),
            train=dataclasses.replace(cfg.train, max_steps=2 * steps + 4),
        )
        trials.append(_measure(trial_cfg, corpus, steps))
    passing = [t for t in trials if t.wait_pct < target_pct]
    recommended = min(passing, key=lambda t: (t.num_workers, t.prefetch_factor)) if passing else None
    warnings = []
    if cfg.data.asset:
        from toolkit.catalogue import data_assets
        from toolkit.catalogue.workspace import Workspace

        asset = data_assets.get(Workspace.open(cfg.data.workspace or None), cfg.data.asset)
        batch = corpus.batch("train", cfg.train.batch_size, torch.Generator().manual_seed(0))
        batch_bytes = sum(t.element_size() * t.numel() for t in batch.values())
        chosen = recommended or trials[-1]
        warnings = layout_warnings(asset.path, chosen.num_workers, batch_bytes, chosen.prefetch_factor)
    return TuneReport(cfg.data.asset or cfg.data.dataset, trials, recommended, target_pct, warnings)
