"""A training rank's start-up and exit, with and without toolkit.startup.long_lived (the collector held off while
torch loads, what it built frozen).

    python bench/bench_startup.py [--rounds 8]

Each round starts two fresh processes, interleaved (plain, held, plain, held, ...): each imports the trainer, builds a
model and its AdamW (which imports torch._dynamo, as every rank's first optimizer does) and exits. Prints the CPU
seconds and wall time of each, and the ratio held / plain per round (median and range).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import figures

PROJECT = Path(__file__).resolve().parent.parent
BUILD = ("from toolkit.train.trainer import Trainer\nimport torch\nmodel = torch.nn.Linear(64, 64)\n"
         "optimizer = torch.optim.AdamW(model.parameters())\n")
VARIANTS = {
    "plain": BUILD,
    "held": "from toolkit.startup import long_lived\nwith long_lived():\n" + "".join(
        f"    {line}\n" for line in BUILD.splitlines()),
}


def one_process(code: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of ``python -c code``, start to exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PROJECT)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    one_process(VARIANTS["plain"])  # warm the page cache: the first process reads torch from disk
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, code in VARIANTS.items():
            measured[name].append(one_process(code))
    print(f"\na rank's start-up and exit, {args.rounds} rounds interleaved (fresh processes)")
    print(f"{'variant':<8} {'CPU s (median)':>15} {'wall s (median)':>16}")
    for name, rows in measured.items():
        print(f"{name:<8} {statistics.median(c for c, _ in rows):>15.2f} {statistics.median(w for _, w in rows):>16.2f}")
    ratios = [h[0] / p[0] for p, h in zip(measured["plain"], measured["held"])]
    print(f"CPU held / plain: median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")
    figures.record(__file__, "held_vs_plain", area="operations", figure="a rank's start-up and exit, CPU",
                   compared="toolkit.startup.long_lived / plain imports, a fresh process each, interleaved",
                   values=ratios, target=("<", 1.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
