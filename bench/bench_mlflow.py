"""MLflow tracking's cost to training: tokens/s with tracking.mlflow=always (a local SQLite store) against never.

    python bench/bench_mlflow.py [--rounds 9] [--steps 300]

The demo config for a fixed number of steps through the path a user runs (`python -m toolkit train demo`: CLI,
supervisor, worker, and with MLflow its follower process), the two sides interleaved A B A B ... with the starting side
alternating, after one warm-up round that is not counted (it also creates the store's database, a one-off). Reported:
each side's tokens/s over the run's training time, the median of the per-round ratios on / off with their range
(target >= 0.99); the same ratio in the steady state (the second half of the logged intervals: the logging itself,
once MLflow's start, about 5 s of CPU in the follower process at low priority, is behind); and each side's median
wall time from the command to its exit (where the follower's work left at the run's end shows).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import figures  # noqa: E402
from toolkit.events import StatusEvent, TrackingEvent, TrainEvent, read_events  # noqa: E402
from toolkit.rundir import RunDir  # noqa: E402
from toolkit.train.metrics import steady_state  # noqa: E402

SIDES = {"off": ["tracking.mlflow=never"], "on": ["tracking.mlflow=always"]}
QUIET = ["train.max_seconds=0", "profile.enabled=false", "train.eval_batches=4", "checkpoint.at_end=false"]
TARGET = 0.99


def cli_run(run_dir: Path, steps: int, settings: list[str], env: dict) -> tuple[float, float, float]:
    """`python -m toolkit train demo` with ``settings``: (tokens/s over the training time, steady-state tokens/s, wall
    seconds)."""
    flags = [x for s in [f"train.max_steps={steps}", f"train.eval_every={steps}", *QUIET, *settings]
             for x in ("--set", s)]
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "toolkit", "train", "demo", "--run-dir", str(run_dir), *flags],
                          capture_output=True, text=True, cwd=PROJECT, env=env)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"run failed: {proc.stderr[-2000:]}")
    run = RunDir(run_dir)
    cfg = run.read_config()
    tracked = read_events(run, TrackingEvent)
    if "tracking.mlflow=always" in settings and [e.state for e in tracked] != ["logging"]:
        raise SystemExit(f"MLflow did not take the run: {tracked}")
    final = read_events(run, StatusEvent)[-1]
    steady = steady_state(read_events(run, TrainEvent)).tokens_per_s
    return steps * cfg.train.batch_size * cfg.model.block_size / final.train_seconds, steady, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9,
                        help="a 1%% effect under ~10%% noise between processes needs more than 5")
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="trainbook-bench-mlflow-") as tmp:
        env = {**os.environ, "TRAINBOOK_WORKSPACE": str(Path(tmp) / "workspace")}
        env.pop("MLFLOW_TRACKING_URI", None)  # the local store, whatever the shell points MLflow at
        print(f"== MLflow tracking: demo model, {args.steps} steps per run (log every 10), through the CLI, "
              f"interleaved, after a warm-up round")
        for side in SIDES:
            cli_run(Path(tmp) / f"warm-{side}", args.steps, SIDES[side], env)
        print(f"  {'round':>5} {'off tok/s':>11} {'on tok/s':>11} {'ratio':>7} {'steady ratio':>13} {'off wall s':>11} "
              f"{'on wall s':>10}")
        ratios, steady, walls = [], [], {side: [] for side in SIDES}
        for r in range(args.rounds):
            order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
            result = {side: cli_run(Path(tmp) / f"{r}-{side}", args.steps, SIDES[side], env) for side in order}
            (off, off_steady, off_wall), (on, on_steady, on_wall) = result["off"], result["on"]
            ratios.append(on / off)
            steady.append(on_steady / off_steady)
            walls["off"].append(off_wall)
            walls["on"].append(on_wall)
            print(f"  {r + 1:>5} {off:>11,.0f} {on:>11,.0f} {on / off:>7.3f} {steady[-1]:>13.3f} {off_wall:>11.1f} "
                  f"{on_wall:>10.1f}", flush=True)
        med = statistics.median(ratios)
        print(f"  on / off: median {med:.3f} (range {min(ratios):.3f} to {max(ratios):.3f}); target >= {TARGET} -> "
              f"{'PASS' if med >= TARGET else 'FAIL'}")
        figures.record(__file__, "on_vs_off", area="operations", figure="MLflow tracking's cost to training",
                       compared="tokens/s, tracking.mlflow=always / never, demo model through the CLI", values=ratios,
                       target=(">=", TARGET))
        print(f"  steady state (second half of the intervals): median {statistics.median(steady):.3f} (range "
              f"{min(steady):.3f} to {max(steady):.3f})")
        print(f"  wall time per run, median: off {statistics.median(walls['off']):.1f} s, on "
              f"{statistics.median(walls['on']):.1f} s (MLflow's follower finishing after the last step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
