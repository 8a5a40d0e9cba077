"""The training watchdog's cost: tokens/s with it on (the default: non-finite steps stopped, hangs watched) against
off (watchdog.nonfinite=apply, watchdog.hang=false).

    python bench/bench_watchdog.py [--rounds 9] [--steps 150]

The demo config as users run it (log every 10 steps), for a fixed number of steps, through the path a user runs
(`python -m toolkit train demo`: CLI, supervisor, worker), the two sides interleaved A B A B ... with the starting
side alternating, after one uncounted warm-up run: tokens/s over each run's training time, the median of the per-round
ratios on / off and their range (target >= 0.99). Twice: with gradient clipping (the default, whose norm the watchdog
reads) and without (optim.grad_clip=0: the watchdog computes the norm itself, one more pass over the gradients). What
it costs per step on CPU: reading the norm (a host sync on a GPU), a clock read and an append for the hang watch;
that work is also timed alone, in this process, against a demo step (a figure a busy machine disturbs less).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402
from bench_accumulation import cli_run  # noqa: E402  (the demo through the CLI; puts the project on the path)

SIDES = {"off": ["watchdog.nonfinite=apply", "watchdog.hang=false"], "on": []}
AS_USERS_LOG = ["train.log_every=10"]  # cli_run logs every step; the demo logs every 10
TARGET = 0.99


def interleaved(rounds: int, steps: int, workdir: Path, extra: list[str]) -> list[float]:
    """Per-round ratios on / off, each round's two runs in alternating order; a line per round."""
    cli_run(workdir / "warm-up", steps, SIDES["off"] + extra)  # data cache, page cache: paid once, not by a side
    print(f"  {'round':>5} {'off tok/s':>11} {'on tok/s':>11} {'ratio':>7}")
    ratios = []
    for r in range(rounds):
        order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
        rate = {side: cli_run(workdir / f"{r}-{side}", steps, SIDES[side] + extra)[0] for side in order}
        ratios.append(rate["on"] / rate["off"])
        print(f"  {r + 1:>5} {rate['off']:>11,.0f} {rate['on']:>11,.0f} {ratios[-1]:>7.3f}", flush=True)
    return ratios


def per_step_work(repeats: int = 2000) -> None:
    """The watchdog's own work per step, timed alone on the demo model's gradients, against a demo step."""
    import torch

    from toolkit import config as config_mod
    from toolkit.train.distributed import Topology
    from toolkit.train.engines import build_engine
    from toolkit.train.models import build_model
    from toolkit.train.trainer import train_step
    from toolkit.train.watchdog import HangClock, NonFiniteGuard, gradients_finite

    cfg = config_mod.load("demo", [])
    torch.manual_seed(0)
    engine = build_engine(build_model(cfg.model), cfg, Topology(0, 0, 1, torch.device("cpu")))
    shape = (cfg.train.batch_size, cfg.model.block_size)
    batch = {"input_ids": torch.randint(0, 256, shape), "labels": torch.randint(0, 256, shape)}
    step_s = []
    for _ in range(23):
        start = time.perf_counter()
        train_step(engine, [batch])
        step_s.append(time.perf_counter() - start)
    step = statistics.median(step_s[3:])
    engine.loss_fn(engine.model, batch).backward()  # gradients to check, as before an update
    params = list(engine.module.parameters())
    norm = torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
    clock, guard = HangClock(cfg.watchdog), NonFiniteGuard(cfg.watchdog)
    clock.start(time.monotonic(), 0)
    start = time.perf_counter()
    for i in range(repeats):
        gradients_finite(params, norm)
        clock.step_done(time.monotonic(), i)
        guard.judge(False)
    read = (time.perf_counter() - start) / repeats
    start = time.perf_counter()
    for _ in range(repeats // 10):
        gradients_finite(params)
    own = (time.perf_counter() - start) / (repeats // 10)
    print(f"== the watchdog's work per step, timed alone (demo model; a step takes {1e3 * step:.1f} ms here)")
    for what, seconds in (("reading clipping's norm + hang clock + verdict", read),
                          ("computing the norm itself (optim.grad_clip=0)", own)):
        print(f"  {what:<47} {1e6 * seconds:>9,.1f} us ({100 * seconds / step:.3f}% of a step)")
    print()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9,
                        help="a 1%% effect under ~10%% noise between processes needs more than 5")
    parser.add_argument("--steps", type=int, default=150, help="optimizer steps per run")
    args = parser.parse_args()

    per_step_work()
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-watchdog-") as tmp:
        for key, title, extra in (
                ("clip", "optim.grad_clip=1 (the demo's): the watchdog reads clipping's norm", []),
                ("no_clip", "optim.grad_clip=0: the watchdog computes the norm itself", ["optim.grad_clip=0"])):
            print(f"== watchdog on vs off, {title}; demo model, {args.steps} steps per run, through the CLI, "
                  "interleaved")
            ratios = interleaved(args.rounds, args.steps, Path(tmp) / ("clip" if not extra else "noclip"),
                                 AS_USERS_LOG + extra)
            med = statistics.median(ratios)
            print(f"  on / off: median {med:.3f} (range {min(ratios):.3f} to {max(ratios):.3f}); target >= {TARGET} "
                  f"-> {'PASS' if med >= TARGET else 'FAIL'}\n")
            figures.record(__file__, f"on_vs_off_{key}", area="operations", figure=f"the watchdog's cost, {title}",
                           compared="tokens/s, watchdog on / off, demo model through the CLI", values=ratios,
                           target=(">=", TARGET))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
