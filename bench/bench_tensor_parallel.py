"""Tensor parallelism on 2 processes: memory per rank and tokens/s at engine.tensor_parallel 1 and 2, predicted and
measured.

    python bench/bench_tensor_parallel.py [--rounds 3] [--steps 12] [--no-baseline]

The ~19M-parameter built-in GPT of bench_memory (6 blocks x 512 wide, 128 tokens, batch 8) through the path a user
runs (`python -m toolkit train tiny`), 2 gloo processes, the two layouts interleaved A B A B over the rounds:

    tp1   2 data-parallel replicas of the whole model (DDP): 2 x 8 rows a step
    tp2   1 replica split over both ranks: 8 rows a step, each rank holding half of every block matrix

Reported per layout: tokens/s (the median of the rounds' last train events), each rank's peak memory against
toolkit.resources.memory_model's prediction for the run's own config, and the bytes each rank sends per step by the
arithmetic (a ring all-reduce of S bytes over n ranks sends 2 (n - 1) / n x S from each):

    tp1   the gradients once a step:                         2 (n - 1) / n x 4 Ψ
    tp2   each block's two row-parallel outputs in forward,  2 (t - 1) / t x 4 L x B T C x 4 bytes
          and the two column-parallel inputs' gradients in backward

On a CPU the split buys memory, not speed: tp2 does half of each matmul on each rank but adds 4 all-reduces a block,
and trains on half the rows a step. The figure to read is memory per rank (the model state halves) and how far the
predictor holds.
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

L, C, T, B = 6, 512, 128, 8
MODEL = [f"model.n_layer={L}", f"model.n_embd={C}", "model.n_head=8", f"model.block_size={T}", f"train.batch_size={B}"]
QUIET = ["profile.enabled=false", "train.eval_batches=2", "checkpoint.at_end=false", "train.log_every=4",
         "engine.nproc=2"]
LAYOUTS = {"tp1": ["engine.tensor_parallel=1"], "tp2": ["engine.tensor_parallel=2"]}


def sent_per_step_mib(layout: str, params: int) -> float:
    """Bytes each rank sends a step, by the ring all-reduce arithmetic above, MiB."""
    if layout == "tp1":
        return 2 * (2 - 1) / 2 * 4 * params / memory_model.MIB
    return 2 * (2 - 1) / 2 * 4 * L * B * T * C * 4 / memory_model.MIB


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
    print(f"== GPT {L} x {C}, {T} tokens, batch {B}, 2 processes, {args.steps} steps, through the CLI, interleaved")
    print(f"  {'round':>5} {'layout':>6} {'tokens/s':>9} {'rank 0 MiB':>11} {'predicted':>10} {'rank 1 MiB':>11} "
          f"{'predicted':>10}")
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-tp-") as tmp:
        for r in range(args.rounds):
            for layout in list(LAYOUTS) if r % 2 == 0 else list(LAYOUTS)[::-1]:
                run = cli_train.train("tiny", Path(tmp) / f"{r}-{layout}", base + LAYOUTS[layout])
                tokens_per_s[layout].append(read_events(run, TrainEvent)[-1].tokens_per_s)
                c = memory_model.compare_run(run.path, device="cpu")
                memory[layout].append(c)
                (m0, m1), (p0, p1) = c.measured_mib, c.prediction.per_rank_mib
                print(f"  {r + 1:>5} {layout:>6} {tokens_per_s[layout][-1]:>9,.0f} {m0:>11,.0f} {p0:>10,.0f} "
                      f"{m1:>11,.0f} {p1:>10,.0f}", flush=True)

    params = memory["tp1"][0].prediction.params
    split = memory["tp2"][0].prediction
    print(f"\n  parameters per rank: tp1 {params:,}, tp2 {split.params:,} (of {split.whole_params:,})")
    for layout in LAYOUTS:
        print(f"  {layout}: sends {sent_per_step_mib(layout, params):,.1f} MiB a step per rank (arithmetic)")
    ratios = [b / a for a, b in zip(tokens_per_s["tp1"], tokens_per_s["tp2"])]
    saved = [statistics.mean(a.measured_mib) - statistics.mean(b.measured_mib)
             for a, b in zip(memory["tp1"], memory["tp2"])]
    kept = [statistics.mean(b.measured_mib) / statistics.mean(a.measured_mib)
            for a, b in zip(memory["tp1"], memory["tp2"])]
    predicted_tp1 = statistics.mean(memory["tp1"][0].prediction.per_rank_mib)
    predicted_saving = predicted_tp1 - statistics.mean(split.per_rank_mib)
    errors = [100 * abs(q - 1) for cs in memory.values() for c in cs for q in c.ratios]
    print(f"  tokens/s tp2 / tp1: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f} to "
          f"{max(ratios):.2f}); tp2 trains on one replica's rows, tp1 on two")
    print(f"  memory per rank saved by the split: median {statistics.median(saved):,.0f} MiB (predicted "
          f"{predicted_saving:,.0f}); worst |measured / predicted - 1| {max(errors):.1f}% (target <= "
          f"{memory_model.TOLERANCE:.0%})")
    figures.record(__file__, "tokens_per_s", area="scaling", figure="tensor parallel 2 against data parallel 2",
                   compared=f"tokens/s, GPT {L} x {C} on 2 CPU processes, tensor_parallel 2 / 1 (one replica "
                   "against two), through the CLI", values=ratios)
    figures.record(__file__, "memory_per_rank", area="scaling", figure="memory per rank at tensor parallel 2",
                   compared=f"peak memory per rank, tensor_parallel 2 / 1, GPT {L} x {C} on 2 CPU processes "
                   f"(predicted {1 - predicted_saving / predicted_tp1:.2f}x)", values=kept)
    figures.record(__file__, "prediction_error", area="memory", figure="peak memory per rank under tensor "
                   "parallelism, predicted", compared="|measured / predicted - 1| per rank, tensor_parallel 1 and 2",
                   values=errors, target=("<=", 100 * memory_model.TOLERANCE), unit="%", judged_on="worst")
    return 0 if max(errors) <= 100 * memory_model.TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
