"""The doctor: how long every check takes here (target: the whole doctor under 60 s), and the all-reduce sweep.

    python bench/bench_doctor.py [--rounds 2]

Each round runs `python -m toolkit doctor --json` in a fresh process, as a user would, in a fresh workspace.
Prints the time per check (median over rounds), the total against the target, and the last round's sweep.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import figures

PROJECT = Path(__file__).resolve().parent.parent
TARGET_S = 60.0


def one_round(tmp: Path, i: int) -> tuple[float, dict]:
    report = tmp / f"doctor-{i}.json"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "toolkit", "doctor", "--json", str(report), "--workspace",
                           str(tmp / f"ws-{i}")], capture_output=True, text=True, cwd=PROJECT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"doctor failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    return wall, json.loads(report.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-doctor-") as tmp:
        rounds = [one_round(Path(tmp), i) for i in range(args.rounds)]
    walls = [w for w, _ in rounds]
    names = [c["name"] for c in rounds[0][1]["checks"]]
    print(f"\ndoctor, {args.rounds} rounds (each a fresh `python -m toolkit doctor` process)")
    print(f"{'check':<16} {'median s':>9} {'max s':>7}  status (last round)")
    for name in names:
        times = [next(c["seconds"] for c in r["checks"] if c["name"] == name) for _, r in rounds]
        status = next(c["status"] for c in rounds[-1][1]["checks"] if c["name"] == name)
        print(f"{name:<16} {statistics.median(times):>9.1f} {max(times):>7.1f}  {status}")
    median = statistics.median(walls)
    print(f"{'whole command':<16} {median:>9.1f} {max(walls):>7.1f}  target < {TARGET_S:.0f} s: "
          f"{'met' if max(walls) < TARGET_S else 'NOT met'} (worst round / target = {max(walls) / TARGET_S:.2f})")
    figures.record(__file__, "whole", area="operations", figure="the whole doctor",
                   compared="wall time of `python -m toolkit doctor --json`, a fresh process a round", values=walls,
                   target=("<", TARGET_S), unit="s", judged_on="worst")
    sweep = next(c for c in rounds[-1][1]["checks"] if c["name"] == "all-reduce")["details"]
    print(f"\n{sweep['table']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
