"""Scaling efficiency at 2 processes, through the `trainbook scale` machinery (toolkit.runs.scaling).

    python bench/bench_scaling.py [--rounds 3] [--steps 20] [--big-steps 8]

Two models, weak scaling (train.batch_size per process), 1 and 2 processes of torch DDP over gloo, each process
on one core (the series gives every process the same share of the cores, as it would get a GPU of its own):

- the demo model (toolkit/configs/demo.yaml: 4 x 96, ~0.45M parameters), on a step budget instead of its 180 s
  time budget;
- a ~20M-parameter GPT (6 layers x 512 wide), 2 sequences of 128 bytes per process, so that a step stays under a
  second on one core.

Per round, one series of each model, interleaved (demo, big, demo, big, ...), so that the machine's drift touches
both alike. Efficiency = tokens/s at 2 / (2 x tokens/s at 1); we quote the median of the rounds with their range.
This machine is shared and noisy: read the direction and the size of the communication share, not the second digit.
The all-reduce moves one gradient (4 bytes a parameter) per step, so the 20M model communicates ~40x more than the
demo model per step, against ~4x more compute per step at these batch sizes; but DDP all-reduces the 20M model's
gradient in ~25 MB buckets while backward still runs, so most of it is in flight without the step waiting
("waited" against "in flight"). On a CPU that overlap is not free: gloo reduces on the cores backward computes on,
and the two processes share memory bandwidth, so a 2-process step's compute is longer than a 1-process one's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import figures  # noqa: E402
from toolkit import config as config_mod  # noqa: E402
from toolkit.runs import scaling  # noqa: E402

MODELS = {  # label -> (config, overrides)
    "demo": ("demo", []),
    "gpt-20M": ("demo", ["model.n_layer=6", "model.n_embd=512", "model.n_head=8", "train.batch_size=2"]),
}


def parameters(config: str, overrides: list[str]) -> int:
    """The model's parameter count, from the model itself (embeddings and norms included)."""
    from toolkit.train.models.gpt import GPT

    return sum(p.numel() for p in GPT(config_mod.load(config, overrides).model).parameters())


def one_series(label: str, steps: int, out: Path) -> scaling.ScalingResult:
    config, overrides = MODELS[label]
    plan = scaling.plan(config, overrides, [1, 2], mode="weak", steps=steps, out=out)
    return scaling.run_series(plan)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="measured steps per run, demo model")
    parser.add_argument("--big-steps", type=int, default=8, help="measured steps per run, 20M model (~0.7 s each)")
    args = parser.parse_args()
    steps = {"demo": args.steps, "gpt-20M": args.big_steps}
    machine = scaling.machine_capacity()
    if machine.processes < 2:
        raise SystemExit(f"needs 2 processes; this machine has {machine.why}")

    print("== the models")
    for label, (config, overrides) in MODELS.items():
        cfg = config_mod.load(config, overrides)
        m, t = cfg.model, cfg.train
        print(f"  {label:<8} {parameters(config, overrides):>12,} parameters ({m.n_layer} x {m.n_embd}, context "
              f"{m.block_size}), {t.batch_size} x {m.block_size} = {t.batch_size * m.block_size:,} tokens per "
              f"process per step, {steps[label]} measured steps")
    print(f"\n== weak scaling, 1 vs 2 processes (torch DDP, gloo), {args.rounds} rounds, interleaved")
    print(f"  {'round':>5} {'model':<8} {'tok/s x1':>10} {'tok/s x2':>10} {'efficiency':>10} {'step ms x1':>10} "
          f"{'x2':>7} {'comm ms x2: waited / in flight':>30} {'s':>5}")
    results: dict[str, list[scaling.ScalingResult]] = {label: [] for label in MODELS}
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-scaling-") as tmp:
        for r in range(args.rounds):
            for label in MODELS:
                t0 = time.perf_counter()
                result = one_series(label, steps[label], Path(tmp) / f"round{r + 1}-{label}")
                one, two = result.rows
                results[label].append(result)
                print(f"  {r + 1:>5} {label:<8} {one.tokens_per_s:>10,.0f} {two.tokens_per_s:>10,.0f} "
                      f"{two.efficiency:>10.3f} {one.step_ms:>10.1f} {two.step_ms:>7.1f} "
                      f"{f'{two.communication_ms:.1f} ({two.communication:.1%}) / {two.in_flight_ms:.1f}':>30} "
                      f"{time.perf_counter() - t0:>5.0f}", flush=True)

    print(f"\n  {'model':<8} {'efficiency at 2: median (range)':>34} {'comm share at 2':>16} {'x1 tok/s':>10}")
    medians = {}
    for label, series in results.items():
        eff = [s.rows[1].efficiency for s in series]
        comm = [s.rows[1].communication for s in series]
        medians[label] = statistics.median(eff)
        print(f"  {label:<8} {f'{medians[label]:.3f} ({min(eff):.3f} to {max(eff):.3f})':>34} "
              f"{statistics.median(comm):>16.1%} {statistics.median(s.rows[0].tokens_per_s for s in series):>10,.0f}")
        figures.record(__file__, f"efficiency_{label.lower()}", area="scaling",
                       figure=f"weak scaling at 2 processes, {label}",
                       compared="tokens/s at 2 / (2 x tokens/s at 1), torch DDP over gloo, a core a process",
                       values=eff)
    print(f"  gpt-20M / demo efficiency: {medians['gpt-20M'] / medians['demo']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
