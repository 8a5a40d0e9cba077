"""DeepSpeed ZeRO-3 against ZeRO-0 on one rank: what partitioning the parameters costs in tokens/s.

    python bench/bench_zero.py [--rounds 3] [--steps 40] [--config demo] [--set section.field=value ...]

`python -m toolkit train CONFIG --engine deepspeed` at engine.zero_stage 0 and 3, interleaved A B A B, through the
CLI. On one rank ZeRO-3 has nothing to partition across, so what it measures is its machinery: parameters gathered
and released around each block's forward and backward, prefetch, hooks. Per run: the median of its train events'
tokens/s, the first log window (start-up) left out. Quoted: ZeRO-3 / ZeRO-0, median and range of the rounds (issue
30's target on one H100: at least 0.9). On a GPU the runs train in bf16 (engine.precision, unless --set says).
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

STAGES = (0, 3)
QUIET = ["train.max_seconds=0", "profile.enabled=false", "train.eval_batches=1", "checkpoint.at_end=false",
         "train.log_every=5"]


def steady_tokens_per_s(run) -> float:
    return statistics.median(e.tokens_per_s for e in read_events(run, TrainEvent)[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--config", default="demo")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = parser.parse_args()
    if args.steps < 15:
        parser.error(f"--steps: {args.steps} is not allowed; allowed: 15 or more (two log windows after the first)")
    import torch

    precision = ["engine.precision=bf16"] if torch.cuda.is_available() else []
    print(f"== ZeRO-3 vs ZeRO-0, one rank, `train {args.config} --engine deepspeed` "
          f"{' '.join(precision + args.settings)}, {args.steps} steps a run, interleaved")
    print(f"  {'round':>5} {'ZeRO-0 tok/s':>13} {'ZeRO-3 tok/s':>13} {'ratio':>7}")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-zero-") as tmp:
        for r in range(args.rounds):
            order = STAGES if r % 2 == 0 else STAGES[::-1]
            got = {}
            for stage in order:
                run = cli_train.train(args.config, Path(tmp) / f"{r}-zero{stage}", [
                    "engine.name=deepspeed", f"engine.zero_stage={stage}", f"train.max_steps={args.steps}",
                    f"train.eval_every={args.steps}", *QUIET, *precision, *args.settings])
                got[stage] = steady_tokens_per_s(run)
            ratios.append(got[3] / got[0])
            print(f"  {r + 1:>5} {got[0]:>13,.0f} {got[3]:>13,.0f} {ratios[-1]:>7.3f}", flush=True)
    med = statistics.median(ratios)
    print(f"  ZeRO-3 / ZeRO-0: median {med:.3f} (range {min(ratios):.3f} to {max(ratios):.3f}); target on a GPU "
          f">= 0.9 -> {'PASS' if med >= 0.9 else 'FAIL'}")
    figures.record(__file__, "zero3_vs_zero0", area="scaling", figure=f"DeepSpeed ZeRO-3 on one rank, {args.config}",
                   compared="tokens/s, ZeRO-3 / ZeRO-0, through the CLI", values=ratios, target=(">=", 0.9),
                   note=None if torch.cuda.is_available() else "the target is set for a GPU; this ran on a CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
