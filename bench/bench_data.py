"""Data path: does the demo model ever wait for data, how fast is the loader alone, how fast is registration.

    python bench/bench_data.py [--rounds 3] [--files 10000]

1. data_wait_pct of the demo config with its default loader settings (target < 2% of step time).
2. tokens/s the loader produces alone vs tokens/s the model consumes (headroom = ratio).
3. Registering a folder of 10,000 small files (snapshot: hash, copy, content-address, sync) vs `cp -r` + sync
   of the same folder, interleaved over rounds, as MB/s and files/s.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import figures  # noqa: E402
from toolkit import config as config_mod  # noqa: E402
from toolkit.data import corpus as data_mod  # noqa: E402
from toolkit.catalogue import data_assets  # noqa: E402
from toolkit.rundir import RunDir  # noqa: E402
from toolkit.train.trainer import Trainer  # noqa: E402
from toolkit.catalogue.workspace import Workspace  # noqa: E402


def loader_vs_model(workdir: Path, steps: int) -> None:
    cfg = config_mod.load("demo", [f"train.max_steps={steps}", "train.max_seconds=0", "profile.enabled=false",
                                   f"train.eval_every={steps}", "train.eval_batches=1", "checkpoint.at_end=false"])
    run = RunDir.create(workdir / "wait", cfg)
    trainer = Trainer(run)
    trainer.train()
    trainer.close()
    train = run.events("train")[1:]  # skip the start-up window
    wait = statistics.median(e["data_wait_pct"] for e in train)
    model_rate = statistics.median(e["tokens_per_s"] for e in train)
    print(f"== demo config, default loader (num_workers={cfg.data.num_workers}), {steps} steps")
    print(f"  data wait: median {wait:.3f}% of step time, max {max(e['data_wait_pct'] for e in train):.3f}% "
          f"(target < 2% -> {'PASS' if wait < 2 else 'FAIL'})")
    figures.record(__file__, "data_wait", area="data", figure="time training waits for data",
                   compared=f"data_wait_pct of the demo config's log windows, {steps} steps",
                   values=[e["data_wait_pct"] for e in train], target=("<", 2.0), unit="%")

    corpus = data_mod.load_corpus(cfg)
    loader = iter(data_mod.train_loader(corpus, cfg, rank=0, first_step=0))
    n = min(steps, 2000)
    t0 = time.perf_counter()
    for _ in range(n):
        next(loader)
    loader_rate = n * cfg.train.batch_size * cfg.model.block_size / (time.perf_counter() - t0)
    print(f"  loader alone {loader_rate:,.0f} tokens/s vs model {model_rate:,.0f} tokens/s: "
          f"{loader_rate / model_rate:,.0f}x headroom")


def make_small_files(folder: Path, count: int) -> int:
    rng = random.Random(0)
    total = 0
    for i in range(count):
        sub = folder / f"d{i // 1000:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(rng.randint(1024, 8192))
        (sub / f"f{i:05d}.bin").write_bytes(data)
        total += len(data)
    return total


def registration(workdir: Path, rounds: int, count: int) -> None:
    src = workdir / "small"
    total = make_small_files(src, count)
    print(f"\n== registering {count:,} small files ({total / 1e6:.1f} MB) vs cp -r + sync, {rounds} interleaved rounds")
    ratios = []
    for r in range(rounds):
        dest = workdir / f"cp-{r}"
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", str(src), str(dest)], check=True)
        os.sync()  # registration makes its snapshot durable before it commits; so must the baseline
        cp_s = time.perf_counter() - t0
        ws = Workspace.open(workdir / f"ws-{r}")
        t0 = time.perf_counter()
        data_assets.register(ws, "small", src)
        reg_s = time.perf_counter() - t0
        ratios.append(cp_s / reg_s)
        print(f"  round {r + 1}: cp -r {cp_s:.2f} s ({total / 1e6 / cp_s:.1f} MB/s, {count / cp_s:,.0f} files/s); "
              f"register {reg_s:.2f} s ({total / 1e6 / reg_s:.1f} MB/s, {count / reg_s:,.0f} files/s)", flush=True)
    print(f"  register speed / cp -r speed: median {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f} to {max(ratios):.2f}); registration also hashes every file, writes a "
          "content-addressed store and links a snapshot tree")
    figures.record(__file__, "registration", area="data", figure=f"registering {count:,} small files",
                   compared="register speed / `cp -r` + sync speed", values=ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainbook-data-bench-") as tmp:
        os.environ["TRAINBOOK_WORKSPACE"] = str(Path(tmp) / "default-ws")
        loader_vs_model(Path(tmp), args.steps)
        registration(Path(tmp), args.rounds, args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
