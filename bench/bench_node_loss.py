"""A lost node: how long from the loss to the first training step of the resubmitted job.

    python bench/bench_node_loss.py [--rounds 3] [--engine torch|deepspeed] [--lost-after 10]

Two simulated nodes on this machine (toolkit.runs.local_nodes: one process tree per node, a shared run folder, the
nodes' store on 127.0.0.1), the tiny model, a checkpoint every 8 steps. Each round, interleaved:
  A. cold start: a new job, from submission to its first step (the baseline: what any start costs);
  B. node loss: a new job; once its step-8 checkpoint is published, node 1 is SIGKILLed whole; node 0 notices (its
     ranks die with their peer's connections; its supervisor then waits --lost-after seconds of silence before it
     calls the node lost and ends the job), and the same job is submitted again at once, as Azure ML's retry or a
     person would: from the kill to the resubmitted job's first step after the checkpoint.
The ratio B / A is what a lost node costs over a plain start; B - A is about --lost-after (60 s on a real cluster:
shorter risks calling a node lost that is only slow) plus the steps retrained since the checkpoint.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

from toolkit.runs.local_nodes import LocalNodesJob  # noqa: E402
from toolkit.rundir import RunDir  # noqa: E402

EVERY = 8
CONFIG = f"""
name: node-loss
model: {{name: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 32}}
optim: {{lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5}}
train: {{batch_size: 8, max_steps: {3 * EVERY}, eval_every: {3 * EVERY}, eval_batches: 2, log_every: 1}}
checkpoint: {{every_steps: {EVERY}}}
"""
ENGINES = {"torch": [], "deepspeed": ["--set", "engine.name=deepspeed", "--set", "engine.zero_stage=2"]}
DEADLINE_S = 600


def _wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)  # other processes' files: no event to wait on


def _first_step_time(run: RunDir) -> float | None:
    """When the run's first train event was written (epoch seconds), or None."""
    times = [e["time"] for e in run.events("train")] if run.events_path.exists() else []
    return times[0] if times else None


def _submit(root: Path, flags: list[str], lost_after: float) -> tuple[LocalNodesJob, RunDir]:
    (root / "shared").mkdir(parents=True, exist_ok=True)
    config = root / "config.yaml"
    config.write_text(CONFIG)
    run = RunDir(root / "shared" / "run")
    return LocalNodesJob(root, run.path, config, *flags, lost_after_s=lost_after), run


def cold_start(root: Path, flags: list[str], lost_after: float) -> float:
    t0 = time.time()
    job, run = _submit(root, flags, lost_after)
    _wait_for(lambda: _first_step_time(run) is not None, "the first step")
    seconds = _first_step_time(run) - t0
    job.wait(timeout=DEADLINE_S)
    return seconds


def node_loss(root: Path, flags: list[str], lost_after: float) -> dict:
    job, run = _submit(root, flags, lost_after)
    _wait_for(lambda: (run.path / "checkpoints" / f"step_{EVERY:08d}" / "manifest.json").exists(), "a checkpoint")
    killed = time.time()
    job.lose_node(1)
    if job.processes[0].wait(timeout=DEADLINE_S) == 0:
        raise SystemExit("node 0 completed the job without node 1")
    noticed = time.time()
    last = max(e["step"] for e in run.events("train"))
    again, _ = _submit(root, flags, lost_after)

    def resumed_steps() -> list[dict]:  # the resubmitted job's train events (written after node 0 ended)
        return [e for e in run.events("train") if e["time"] > noticed]

    _wait_for(resumed_steps, "the first resumed step")
    resumed = [e for e in run.events("status") if e.get("resumed_step")][-1]
    first = resumed_steps()[0]
    codes = again.wait(timeout=DEADLINE_S)
    if codes != [0, 0]:
        raise SystemExit(f"the resubmitted job failed: {codes}\n{again.output(0)[-2000:]}")
    return {"noticed_s": noticed - killed, "first_step_s": first["time"] - noticed, "total_s": first["time"] - killed,
            "retrained": last - resumed["resumed_step"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", choices=list(ENGINES), default="torch")
    parser.add_argument("--lost-after", type=float, default=10.0, help="seconds of silence before a node is lost")
    args = parser.parse_args()
    flags = ENGINES[args.engine]
    print(f"== node loss, 2 simulated nodes x 1 rank, {args.engine} engine, tiny model, checkpoint every {EVERY} "
          f"steps, --lost-after {args.lost_after:g} s; A = cold start to first step, B = kill to first resumed step")
    print(f"  {'round':>5} {'A cold s':>9} {'B total s':>10} {'noticed s':>10} {'resubmit->step s':>17} "
          f"{'steps lost':>11} {'B / A':>7}")
    ratios, totals = [], []
    with tempfile.TemporaryDirectory(prefix="bench-node-loss-") as tmp:
        for r in range(args.rounds):
            order = ("A", "B") if r % 2 == 0 else ("B", "A")  # neither side always first, on a machine that drifts
            got = {}
            for side in order:
                root = Path(tmp) / f"round{r}-{side}"
                got[side] = cold_start(root, flags, args.lost_after) if side == "A" else \
                    node_loss(root, flags, args.lost_after)
            a, b = got["A"], got["B"]
            ratios.append(b["total_s"] / a)
            totals.append(b["total_s"])
            print(f"  {r + 1:>5} {a:>9.1f} {b['total_s']:>10.1f} {b['noticed_s']:>10.1f} {b['first_step_s']:>17.1f} "
                  f"{b['retrained']:>11} {ratios[-1]:>7.2f}", flush=True)
    print(f"\n  node loss to first resumed step: median {statistics.median(totals):.1f} s "
          f"(range {min(totals):.1f} to {max(totals):.1f}); B / A median {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f} to {max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
