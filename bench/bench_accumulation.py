"""Gradient accumulation: what splitting a step into micro-batches costs, and what it saves DDP in communication.

    python bench/bench_accumulation.py [--rounds 5] [--steps 30] [--demo-width]

1. 4 micro-batches of 8 against one batch of 32 (the same 32 sequences a step, so the same losses), the demo config
   at 6 x 256 (see MODEL), through the path a user runs (`python -m toolkit train demo`, CLI, supervisor, worker), the two sides interleaved
   A B A B ... over several rounds: tokens/s over each run's training time, the median of the per-round ratios and
   their range (target >= 0.95), and the largest relative difference between the two runs' losses, step by step.
2. DDP over 2 processes, with accumulation (4 x 8) and without (1 x 32): all-reduces per optimizer step, counted by
   a DDP communication hook in a 2-process torchrun of the torch engine (no_sync on the inner micro-steps should leave
   1 per bucket instead of 4), and tokens/s through the CLI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import cli_train  # noqa: E402
import figures  # noqa: E402
from toolkit.events import StatusEvent, TrainEvent, read_events  # noqa: E402

SIDES = {"1 x 32": ["train.batch_size=32", "train.grad_accum_steps=1"],
         "4 x 8": ["train.batch_size=8", "train.grad_accum_steps=4"]}
QUIET = ["train.max_seconds=0", "profile.enabled=false", "train.eval_batches=1", "checkpoint.at_end=false",
         "train.log_every=1"]
# The demo config's layout at a width where a micro-batch of 8 x 128 tokens still fills a matmul: 6 x 256 (4.8M
# parameters). At the demo's own width (96, 0.45M parameters) a step is so small that splitting it in four mostly
# measures per-operation overhead, which the bench also reports (--demo-width) but which no model worth accumulating
# for has.
MODEL = ["model.n_layer=6", "model.n_embd=256", "model.n_head=8"]


def cli_run(run_dir: Path, steps: int, settings: list[str]) -> tuple[float, list[float]]:
    """`python -m toolkit train demo` with ``settings``: (tokens/s over the training time, the loss of every step)."""
    run = cli_train.train("demo", run_dir, [f"train.max_steps={steps}", f"train.eval_every={steps}", *QUIET,
                                            *settings])
    cfg = run.read_config()
    final = read_events(run, StatusEvent)[-1]
    tokens = steps * cfg.train.batch_size * cfg.train.grad_accum_steps * cfg.model.block_size * cfg.engine.nproc
    return tokens / final.train_seconds, [e.loss for e in read_events(run, TrainEvent)]


def interleaved(rounds: int, steps: int, workdir: Path, extra: list[str]) -> tuple[list[float], float, dict]:
    """Both sides per round, the starting side alternating; (per-round ratios 4x8 / 1x32, max loss difference,
    median tokens/s per side)."""
    ratios, worst, rates = [], (0.0, 0), {side: [] for side in SIDES}
    for r in range(rounds):
        order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
        result = {side: cli_run(workdir / f"{r}-{side.replace(' ', '')}", steps, SIDES[side] + extra)
                  for side in order}
        (whole, whole_losses), (split, split_losses) = result["1 x 32"], result["4 x 8"]
        ratios.append(split / whole)
        # (difference, first step past 1e-4): float reordering is amplified by training, most at a high LR
        diffs = [abs(a - b) / abs(b) for a, b in zip(split_losses, whole_losses)]
        worst = max(worst, (max(diffs), next((i + 1 for i, d in enumerate(diffs) if d > 1e-4), 0)))
        for side, (rate, _) in result.items():
            rates[side].append(rate)
        print(f"  {r + 1:>5} {whole:>12,.0f} {split:>12,.0f} {split / whole:>7.3f}", flush=True)
    return ratios, worst, {side: statistics.median(v) for side, v in rates.items()}


def count_all_reduces() -> None:
    """(internal, one rank of a 2-process torchrun) DDP all-reduces per optimizer step of the torch engine, with and
    without accumulation; rank 0 prints them as JSON."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from toolkit import config as config_mod
    from toolkit.train import distributed
    from toolkit.train.engines import build_engine
    from toolkit.train.models import build_model
    from toolkit.train.trainer import train_step

    counts = {}
    for side, settings in SIDES.items():
        cfg = config_mod.load("demo", settings)
        topo = distributed.setup(cfg.engine)
        torch.manual_seed(0)
        engine = build_engine(build_model(cfg.model), cfg, topo)
        calls = [0]

        def counting_hook(state, bucket):
            calls[0] += 1
            return allreduce_hook(state, bucket)

        engine.model.register_comm_hook(None, counting_hook)
        B, T, n = cfg.train.batch_size, cfg.model.block_size, cfg.train.grad_accum_steps
        steps = 4
        for step in range(steps + 1):
            if step == 1:
                calls[0] = 0  # DDP sizes its buckets during the first step: count the steady state after it
            micro = [{"input_ids": torch.randint(0, 256, (B, T)), "labels": torch.randint(0, 256, (B, T))}
                     for _ in range(n)]
            train_step(engine, micro)
        counts[side] = calls[0] / steps
    if dist.get_rank() == 0:
        print(json.dumps(counts))
    distributed.teardown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps per run")
    parser.add_argument("--demo-width", action="store_true", help="the demo model as it is (0.45M parameters)")
    parser.add_argument("--count-all-reduces", action="store_true", help="(internal) one rank of the DDP count")
    args = parser.parse_args()
    if args.count_all_reduces:
        count_all_reduces()
        return 0

    model = [] if args.demo_width else MODEL
    shape = "demo model (4 x 96)" if args.demo_width else "demo layout at 6 x 256 (4.8M parameters)"
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-accum-") as tmp:
        print(f"== accumulation, 1 process: 4 micro-batches x 8 vs 1 batch x 32, {shape}, {args.steps} steps per "
              f"run, through the CLI, interleaved")
        print(f"  {'round':>5} {'1x32 tok/s':>12} {'4x8 tok/s':>12} {'ratio':>7}")
        ratios, worst, _ = interleaved(args.rounds, args.steps, Path(tmp) / "one", model)
        med = statistics.median(ratios)
        print(f"  4x8 / 1x32: median {med:.3f} (range {min(ratios):.3f} to {max(ratios):.3f}); target >= 0.95 -> "
              f"{'PASS' if med >= 0.95 else 'FAIL'}")
        figures.record(__file__, "one_process", area="training", figure="gradient accumulation, 1 process",
                       compared=f"tokens/s, 4 micro-batches x 8 / 1 batch x 32, {shape}, through the CLI",
                       values=ratios, target=(">=", 0.95))
        print(f"  losses, step by step: largest relative difference {worst[0]:.2e} (same rows, summed in another "
              f"order){f'; first above 1e-4 at step {worst[1]}' if worst[1] else ''}")

        print("\n== DDP, 2 processes: all-reduces per optimizer step (communication hook on the torch engine)")
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                               "--master_port", str(_free_port()), __file__, "--count-all-reduces"],
                              capture_output=True, text=True, cwd=PROJECT, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-2000:])
        counts = json.loads(proc.stdout.strip().splitlines()[-1])
        for side, per_step in counts.items():
            print(f"  {side:<8} {per_step:>5.1f} all-reduces per optimizer step")
        print(f"  with accumulation: {counts['4 x 8']:.0f} vs {4 * counts['1 x 32']:.0f} without no_sync (one per "
              "micro-step)")

        rounds = max(2, args.rounds // 2)
        print(f"\n== DDP, 2 processes: tokens/s with accumulation vs without, {args.steps} steps, {rounds} rounds")
        print(f"  {'round':>5} {'1x32 tok/s':>12} {'4x8 tok/s':>12} {'ratio':>7}")
        ratios, worst, _ = interleaved(rounds, args.steps, Path(tmp) / "ddp", ["engine.nproc=2", *model])
        print(f"  4x8 / 1x32 over 2 processes: median {statistics.median(ratios):.3f} (range {min(ratios):.3f} to "
              f"{max(ratios):.3f}); losses differ by at most {worst[0]:.2e}"
              f"{f' (first above 1e-4 at step {worst[1]}: rounding amplified by training at lr 8e-3)' if worst[1] else ''}")
        figures.record(__file__, "ddp", area="scaling", figure="gradient accumulation, DDP over 2 processes",
                       compared=f"tokens/s, 4 micro-batches x 8 / 1 batch x 32, {shape}, through the CLI",
                       values=ratios)
    return 0


def _free_port() -> int:
    from toolkit.ports import free_port

    return free_port()


if __name__ == "__main__":
    raise SystemExit(main())
