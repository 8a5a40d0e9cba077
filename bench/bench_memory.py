"""Peak memory per rank: the estimator's prediction against what runs measure, per ZeRO stage.

    python bench/bench_memory.py [--steps 3] [--no-baseline] [--only zero2,ddp]

A ~19M-parameter built-in GPT (6 blocks x 512 wide, 128 tokens, batch 8) trained for a few steps through the CLI
(`python -m toolkit train tiny --run-dir DIR --set ...`) on 2 processes: torch DDP, DeepSpeed ZeRO-0 to 3, ZeRO-2
with train.grad_accum_steps=4 and ZeRO-2 with model.activation_checkpointing=true. Each rank's measured peak is the
last train event's peak_memory_mb (CPU: the process's peak resident set); the prediction is
toolkit.resources.memory_model.predict_run for the run's own config. First the baseline each prediction starts
from is measured on this machine (the tiny config's peak per rank, ~30 s per engine; --no-baseline keeps the
cached or reference figure).

Target: within 15% per rank (memory_model.TOLERANCE). The "guide" column is the guide's model state alone (fp32
Adam, 16 bytes a parameter partitioned by stage): what the formula said before it was corrected for a CPU.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import figures  # noqa: E402
from toolkit.resources import memory_baseline, memory_model, zero_stages  # noqa: E402

PROJECT = Path(__file__).resolve().parent.parent
MODEL = ["model.n_layer=6", "model.n_embd=512", "model.n_head=8", "model.block_size=128", "train.batch_size=8"]
DS = ["engine.name=deepspeed", "engine.nproc=2"]
ROWS = {  # label -> overrides
    "ddp": ["engine.name=torch", "engine.nproc=2"],
    "zero0": [*DS, "engine.zero_stage=0"],
    "zero1": [*DS, "engine.zero_stage=1"],
    "zero2": [*DS, "engine.zero_stage=2"],
    "zero3": [*DS, "engine.zero_stage=3"],
    "zero2+accum4": [*DS, "engine.zero_stage=2", "train.grad_accum_steps=4"],
    "zero2+ckpt": [*DS, "engine.zero_stage=2", "model.activation_checkpointing=true"],
}


def settings(steps: int) -> list[str]:
    # The peak is reached by the second step (the first creates the optimizer state); no checkpoint, and two
    # validation batches so that each rank of a ZeRO-3 run takes part in every gathered forward.
    return [*MODEL, f"train.max_steps={steps}", "train.log_every=1", f"train.eval_every={steps}",
            "train.eval_batches=2", "checkpoint.at_end=false", "profile.enabled=false"]


def train(run_dir: Path, overrides: list[str]) -> float:
    """One run through the CLI, as a user starts it; returns its wall time."""
    flags = [item for s in overrides for item in ("--set", s)]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "toolkit", "train", "tiny", "--run-dir", str(run_dir), *flags],
                          capture_output=True, text=True, cwd=PROJECT, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{run_dir.name}: training failed: {proc.stderr.strip()[-2000:]}")
    return time.perf_counter() - t0


def guide_mib(prediction) -> float:
    """The guide's model state per rank for this run (fp32 Adam: 16 bytes a parameter, partitioned by stage)."""
    stage = prediction.zero_stage if prediction.engine == "deepspeed" else 0
    return zero_stages.estimate(prediction.params, "fp32", stage, prediction.nproc).total_bytes / memory_model.MIB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="training steps per run (default 3)")
    parser.add_argument("--no-baseline", action="store_true", help="keep the cached (or reference) baseline")
    parser.add_argument("--only", help=f"comma-separated rows: {', '.join(ROWS)}")
    args = parser.parse_args()
    rows = args.only.split(",") if args.only else list(ROWS)
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"--only: {unknown[0]!r} is not a row; rows: {', '.join(ROWS)}")
    start = time.perf_counter()

    print("== baseline: the tiny config's peak per rank (Python, torch, deepspeed, gloo, data, TensorBoard)")
    for engine in sorted({"torch" if r == "ddp" else "deepspeed" for r in rows}):
        if not args.no_baseline:
            memory_baseline.measure_baseline(engine)
        ranks, source = memory_baseline.baseline_mib(engine, 2)
        print(f"  {engine:<10} rank 0 {ranks[0]:,.0f} MiB, rank 1 {ranks[1]:,.0f} MiB  ({source})", flush=True)

    print(f"\n== 2 processes, {args.steps} steps each, {' '.join(MODEL)}")
    print(f"  {'run':<14} {'rank':>4} {'guide':>7} {'predicted':>10} {'measured':>9} {'ratio':>6}  "
          f"{'within ' + format(memory_model.TOLERANCE, '.0%'):<11} time")
    results: dict[str, memory_model.RunComparison] = {}
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-memory-") as tmp:
        for label in rows:
            seconds = train(Path(tmp) / label, [*settings(args.steps), *ROWS[label]])
            results[label] = c = memory_model.compare_run(Path(tmp) / label, device="cpu")
            for rank, (p, m, q, ok) in enumerate(zip(c.prediction.per_rank_mib, c.measured_mib, c.ratios,
                                                     c.within_tolerance)):
                worst = max(worst, abs(q - 1))
                print(f"  {label if rank == 0 else '':<14} {rank:>4} {guide_mib(c.prediction):>7,.0f} {p:>10,.0f} "
                      f"{m:>9,.0f} {q:>6.2f}  {'yes' if ok else 'NO':<11} {f'{seconds:.0f} s' if rank == 0 else ''}",
                      flush=True)

    if "zero2+ckpt" in results and "zero2" in results:
        saved = [a - b for a, b in zip(results["zero2"].measured_mib, results["zero2+ckpt"].measured_mib)]
        predicted = [a - b for a, b in zip(results["zero2"].prediction.per_rank_mib,
                                           results["zero2+ckpt"].prediction.per_rank_mib)]
        state = "PENDING: no memory saved, model.activation_checkpointing not in effect in this checkout" \
            if max(saved) < 0.25 * predicted[0] else "in effect"
        print(f"\n  activation checkpointing saves {', '.join(f'{s:,.0f}' for s in saved)} MiB per rank "
              f"(predicted {predicted[0]:,.0f}): {state}")
    if "zero0" in results:
        psi = results["zero0"].prediction.params
        per_param = [(sum(c.measured_mib) / len(c.measured_mib) - sum(c.prediction.baseline_mib) / 2 -
                      next(t.bytes for t in c.prediction.terms if t.name == "activations") / memory_model.MIB) * memory_model.MIB / psi
                     for label, c in results.items() if label.startswith("zero") and "+" not in label]
        print(f"  model state on CPU, measured bytes per parameter by stage (baseline and activations taken out): "
              f"{' -> '.join(f'{b:.1f}' for b in per_param)}; the guide's fp32 figure: 16 -> 12 -> 10 -> 8")
    ok = worst <= memory_model.TOLERANCE
    errors = [100 * abs(q - 1) for c in results.values() for q in c.ratios]
    figures.record(__file__, "prediction_error", area="memory", figure="peak memory per rank, predicted",
                   compared=f"|measured / predicted - 1| per rank, 2 processes: {', '.join(rows)}", values=errors,
                   target=("<=", 100 * memory_model.TOLERANCE), unit="%", judged_on="worst")
    print(f"\n  worst |measured / predicted - 1| = {worst:.1%}; target <= {memory_model.TOLERANCE:.0%} per rank -> "
          f"{'PASS' if ok else 'FAIL'}  ({time.perf_counter() - start:.0f} s in all)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
