"""Model parallelism on 2 processes: memory per rank and tokens/s at engine.tensor_parallel 1 and 2 and
engine.pipeline_parallel 1 and 2, predicted and measured.

    python bench/bench_model_parallel.py [--rounds 3] [--steps 12] [--no-baseline]

The ~19M-parameter built-in GPT of bench_memory (6 blocks x 512 wide, 128 tokens; 2 micro-batches of 4 a step, so
that a 2-stage pipeline has one in flight per stage) through the path a user runs (`python -m toolkit train tiny`),
2 gloo processes, the three layouts interleaved over the rounds (A B C, then C B A):

    dp2   2 data-parallel replicas of the whole model (DDP): 2 x 8 rows a step
    tp2   1 replica split over both ranks: 8 rows a step, each rank holding half of every block matrix
    pp2   1 replica in 2 pipeline stages of 3 blocks: 8 rows a step, 1F1B over its 2 micro-batches

Reported per layout: tokens/s (the median of the rounds' last train events), each rank's peak memory against
toolkit.resources.memory_model's prediction for the run's own config, and the bytes each rank sends per step by the
arithmetic (a ring all-reduce of S bytes over n ranks sends 2 (n - 1) / n x S from each):

    dp2   the gradients once a step:                         2 (n - 1) / n x 4 Ψ
    tp2   each block's two row-parallel outputs in forward,  2 (t - 1) / t x 4 L x B T C x 4 bytes
          and the two column-parallel inputs' gradients in backward
    pp2   each micro-batch's residual stream forward, its    m x B T C x 4 bytes, and the tied embedding's
          gradient back (one or the other a rank)            gradient all-reduced: V C x 4 bytes

On a CPU the splits buy memory, not speed: tp2 does half of each matmul on each rank but adds 4 all-reduces a block;
pp2 runs each half of the model on one rank and idles (p - 1) / (m + p - 1) of a step in the pipeline's bubble. Both
train on one replica's rows a step where dp2 trains on two. The figures to read are memory per rank (the model state
halves) and how far the predictor holds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import cli_train  # noqa: E402
import figures  # noqa: E402
from toolkit.events import TrainEvent, read_events  # noqa: E402
from toolkit.resources import memory_baseline, memory_model  # noqa: E402

L, C, T, B, M = 6, 512, 128, 4, 2
MODEL = [f"model.n_layer={L}", f"model.n_embd={C}", "model.n_head=8", f"model.block_size={T}", f"train.batch_size={B}",
         f"train.grad_accum_steps={M}"]
QUIET = ["profile.enabled=false", "train.eval_batches=2", "checkpoint.at_end=false", "train.log_every=4",
         "engine.nproc=2"]
LAYOUTS = {"dp2": [], "tp2": ["engine.tensor_parallel=2"], "pp2": ["engine.pipeline_parallel=2"]}


def sent_per_step_mib(layout: str, params: int) -> float:
    """Bytes each rank sends a step, by the arithmetic above, MiB."""
    if layout == "dp2":
        sent = 2 * (2 - 1) / 2 * 4 * params
    elif layout == "tp2":
        sent = 2 * (2 - 1) / 2 * 4 * L * M * B * T * C * 4
    else:
        sent = M * B * T * C * 4 + 256 * C * 4
    return sent / memory_model.MIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--no-baseline", action="store_true", help="keep the cached (or reference) baseline")
    args = parser.parse_args()
    base = [*MODEL, *QUIET, f"train.max_steps={args.steps}", f"train.eval_every={args.steps}"]
    if not args.no_baseline:  # the predictions start from this machine's baseline, as bench_memory's do
        memory_baseline.measure_baseline("torch")
    tokens_per_s: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    memory: dict[str, list[memory_model.RunComparison]] = {layout: [] for layout in LAYOUTS}
    print(f"== GPT {L} x {C}, {T} tokens, {M} micro-batches of {B}, 2 processes, {args.steps} steps, through the CLI, "
          "interleaved")
    print(f"  {'round':>5} {'layout':>6} {'tokens/s':>9} {'rank 0 MiB':>11} {'predicted':>10} {'rank 1 MiB':>11} "
          f"{'predicted':>10}")
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-mp-") as tmp:
        for r in range(args.rounds):
            for layout in list(LAYOUTS) if r % 2 == 0 else list(LAYOUTS)[::-1]:
                run = cli_train.train("tiny", Path(tmp) / f"{r}-{layout}", base + LAYOUTS[layout])
                tokens_per_s[layout].append(read_events(run, TrainEvent)[-1].tokens_per_s)
                c = memory_model.compare_run(run.path, device="cpu")
                memory[layout].append(c)
                (m0, m1), (p0, p1) = c.measured_mib, c.prediction.per_rank_mib
                print(f"  {r + 1:>5} {layout:>6} {tokens_per_s[layout][-1]:>9,.0f} {m0:>11,.0f} {p0:>10,.0f} "
                      f"{m1:>11,.0f} {p1:>10,.0f}", flush=True)

    params = memory["dp2"][0].prediction.params
    print(f"\n  parameters per rank: dp2 {params:,}, tp2 {memory['tp2'][0].prediction.params:,}, pp2 "
          f"{memory['pp2'][0].prediction.params:,} (rank 0's stage)")
    for layout in LAYOUTS:
        print(f"  {layout}: sends {sent_per_step_mib(layout, params):,.1f} MiB a step per rank (arithmetic)")
    predicted_dp2 = statistics.mean(memory["dp2"][0].prediction.per_rank_mib)
    for split in ("tp2", "pp2"):
        ratios = [b / a for a, b in zip(tokens_per_s["dp2"], tokens_per_s[split])]
        kept = [statistics.mean(b.measured_mib) / statistics.mean(a.measured_mib)
                for a, b in zip(memory["dp2"], memory[split])]
        predicted_kept = statistics.mean(memory[split][0].prediction.per_rank_mib) / predicted_dp2
        name = {"tp2": "tensor parallel 2", "pp2": "pipeline parallel 2"}[split]
        print(f"  tokens/s {split} / dp2: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f} to "
              f"{max(ratios):.2f}); {split} trains on one replica's rows, dp2 on two")
        if split == "pp2":  # each rank computes half the model on a replica's rows, idle in the bubble
            bubble = (M + 2 - 1) / M
            print(f"  the bubble's arithmetic: a pp2 step takes {bubble:.2f} x half of a dp2 step's compute, so "
                  f"{1 / (2 * 0.5 * bubble):.2f}x dp2's tokens/s before dp2's all-reduce, which it does not pay")
        print(f"  memory per rank {split} / dp2: median {statistics.median(kept):.2f}x (predicted "
              f"{predicted_kept:.2f}x)")
        figures.record(__file__, f"{split}.tokens_per_s", area="scaling", figure=f"{name} against data parallel 2",
                       compared=f"tokens/s, GPT {L} x {C} on 2 CPU processes, {split} / dp2 (one replica against "
                       "two), through the CLI", values=ratios)
        figures.record(__file__, f"{split}.memory_per_rank", area="scaling", figure=f"memory per rank at {name}",
                       compared=f"peak memory per rank, {split} / dp2, GPT {L} x {C} on 2 CPU processes (predicted "
                       f"{predicted_kept:.2f}x)", values=kept)
    errors = [100 * abs(q - 1) for cs in memory.values() for c in cs for q in c.ratios]
    print(f"  worst |measured / predicted - 1| over every rank and layout: {max(errors):.1f}% (target <= "
          f"{memory_model.TOLERANCE:.0%})")
    figures.record(__file__, "prediction_error", area="memory", figure="peak memory per rank under tensor and "
                   "pipeline parallelism, predicted", compared="|measured / predicted - 1| per rank, dp2, tp2 and pp2",
                   values=errors, target=("<=", 100 * memory_model.TOLERANCE), unit="%", judged_on="worst")
    return 0 if max(errors) <= 100 * memory_model.TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
