"""Training throughput: Trainbook's loop against a bare hand-written loop, and the engines against each other.

    python bench/bench_training.py [--rounds 5] [--steps 100] [--skip-engines]

1. The fp32 matmul peak of this machine (the denominator of every MFU figure; cached for training runs).
2. The path a user runs: `python -m toolkit train demo` (the CLI follower, the supervisor, the worker) against
   the bare loop run as its own process, whole processes interleaved A B A B ... over several rounds; each
   side's tokens/s counts its training loop only (the run's train_seconds; the bare loop's timed loop), not
   interpreter start-up. This machine is noisy (30% between processes), so we quote the median of the
   per-round ratios and their range. Target: toolkit >= 0.97 of the bare loop.
3. The same comparison in this one process (the Trainer against the bare loop, no CLI or supervisor): what
   the loop itself costs, to tell it apart from what the processes around it cost.
4. Engines through the real launcher: torch vs deepspeed, 1 vs 2 processes (steady-state tokens/s from
   events.jsonl), as ratios to torch x 1.
5. The optimizer step: AdamW's update as the torch engine makes it (fused, toolkit.train.engines.torch_engine)
   against torch's default (on a CPU a loop over the tensors), on the demo model and on a ~100M-parameter GPT, interleaved A B B A: the
   time of the fused update over the default's (for reference: why the engine asks for the fused kernel).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import figures  # noqa: E402
from toolkit import config as config_mod  # noqa: E402
from toolkit.data import corpus as data_mod  # noqa: E402
from toolkit.train import flops  # noqa: E402
from toolkit.runs import launch  # noqa: E402
from toolkit.train.models.gpt import GPT, training_flops_per_token  # noqa: E402
from toolkit.events import StatusEvent, read_events  # noqa: E402
from toolkit.rundir import RunDir  # noqa: E402
from toolkit.train.trainer import Trainer  # noqa: E402


def bench_config(steps: int, extra: list[str] | None = None) -> config_mod.Config:
    # Evaluate once, on one batch, at the end, and no checkpoint: the timing is about the training loop
    # (bench_checkpoint.py measures what checkpoints cost).
    return config_mod.load("demo", [f"train.max_steps={steps}", f"train.eval_every={steps}", *BENCH_SETTINGS,
                                    *(extra or [])])


def bare_loop(cfg: config_mod.Config, steps: int) -> float:
    """nanoGPT's loop, written out by hand: sample, forward, backward, clip, step. Returns seconds for `steps`."""
    torch.manual_seed(cfg.train.seed)
    model = GPT(cfg.model)
    o = cfg.optim
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=o.lr, betas=(o.beta1, o.beta2),
                                  fused=True)  # the kernel the torch engine steps with: the ratio is the overhead
    data = torch.frombuffer(bytearray(data_mod.pydoc_text()), dtype=torch.uint8)
    data = data[: int(len(data) * (1 - cfg.data.val_fraction))]
    B, T = cfg.train.batch_size, cfg.model.block_size
    t0 = time.perf_counter()
    for step in range(steps):
        ix = torch.randint(len(data) - T - 1, (B,))
        x = torch.stack([data[i:i + T] for i in ix]).long()
        y = torch.stack([data[i + 1:i + 1 + T] for i in ix]).long()
        lr = o.lr * min(1.0, (step + 1) / max(1, o.warmup_steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    loss.item()
    return time.perf_counter() - t0


def toolkit_loop(cfg: config_mod.Config, workdir: Path, round_no: int) -> float:
    """The real Trainer (run directory, events, TensorBoard, data loader, final eval), timed around train()."""
    run = RunDir.create(workdir / f"toolkit-{round_no}", cfg)
    trainer = Trainer(run)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    trainer.close()
    return seconds


BENCH_SETTINGS = ["train.max_seconds=0", "profile.enabled=false", "train.eval_batches=1", "checkpoint.at_end=false"]


def bare_process(steps: int) -> float:
    """The bare loop in a process of its own (as the CLI's worker is): tokens/s of its timed loop."""
    out = subprocess.run([sys.executable, __file__, "--bare-only", "--steps", str(steps)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])["tokens_per_s"]


ROLES = (("toolkit.runs.worker", "worker"), ("toolkit.runs.supervisor", "supervisor"), ("toolkit", "CLI follower"))


def _role(process: psutil.Process) -> str | None:
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return None
    return next((role for marker, role in ROLES if marker in command), None)


def cli_process(steps: int, run_dir: Path) -> tuple[float, dict[str, float]]:
    """`python -m toolkit train demo` as a user types it: tokens/s over the run's training time, and the CPU
    seconds each of its processes used (sampled once a second from /proc: the last second of a process that ends
    is missed, which is nothing for the two that wait)."""
    flags = [item for s in [f"train.max_steps={steps}", f"train.eval_every={steps}", *BENCH_SETTINGS]
             for item in ("--set", s)]
    cli = subprocess.Popen([sys.executable, "-m", "toolkit", "train", "demo", "--run-dir", str(run_dir), *flags],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
    cpu: dict[int, tuple[str, float]] = {}
    root = psutil.Process(cli.pid)
    while True:
        try:
            cli.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(psutil.Error):
            for process in [root, *root.children(recursive=True)]:
                role = _role(process)
                if role:
                    times = process.cpu_times()
                    cpu[process.pid] = (role, times.user + times.system)
    if cli.returncode != 0:
        raise SystemExit(f"the CLI run failed: {cli.stderr.read().decode()[-2000:]}")
    by_role: dict[str, float] = {}
    for role, seconds in cpu.values():
        by_role[role] = by_role.get(role, 0.0) + seconds
    run = RunDir(run_dir)
    cfg = run.read_config()
    final = read_events(run, StatusEvent)[-1]  # the completed run's status: training time, evaluation excluded
    by_role["train_seconds"] = final.train_seconds
    return steps * cfg.train.batch_size * cfg.model.block_size / final.train_seconds, by_role


def steady_tokens_per_s(run: RunDir) -> float:
    train = run.events("train")
    tail = train[1:] or train  # the first window holds start-up
    return statistics.median(e["tokens_per_s"] for e in tail)


def engine_comparison(steps: int, workdir: Path) -> list[tuple[str, float]]:
    combos = [("torch x1", ["engine.name=torch", "engine.nproc=1"]),
              ("torch x2 (DDP, torchrun)", ["engine.name=torch", "engine.nproc=2"]),
              ("deepspeed ZeRO-0 x1", ["engine.name=deepspeed", "engine.nproc=1"]),
              ("deepspeed ZeRO-2 x2 (ds launcher)", ["engine.name=deepspeed", "engine.nproc=2", "engine.zero_stage=2"])]
    rows = []
    for label, extra in combos:
        cfg = bench_config(steps, ["train.log_every=10", *extra])
        handle = launch.start(cfg, run_dir=workdir / label.split()[0] / label.replace(" ", "_"))
        code = handle.wait()
        if code != 0:
            raise SystemExit(f"{label}: training failed, see {handle.path / launch.LOG_NAME}")
        rows.append((label, steady_tokens_per_s(handle.run)))
        print(f"  {label:<36} {rows[-1][1]:>10,.0f} tokens/s", flush=True)
    return rows


def optimizer_step_comparison(rounds: int) -> None:
    """Section 5: the time of one AdamW update, fused / torch's default, per model, over interleaved rounds."""
    from toolkit.train.engines.param_groups import adamw_param_groups
    from toolkit.train.engines.torch_engine import adamw_implementation

    print(f"== the optimizer step: AdamW fused (the torch engine's) / torch's default, {rounds} rounds A B B A")
    for label, settings, repeats in (("demo model", [], 50), ("14 x 768 GPT", ["model.n_layer=14", "model.n_embd=768"], 5)):
        model = GPT(config_mod.load("demo", settings).model)
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        groups = adamw_param_groups(model, 0.1)
        optimizers = {"fused": torch.optim.AdamW(groups, lr=1e-4, **adamw_implementation(torch.device("cpu"), groups)),
                      "default": torch.optim.AdamW(adamw_param_groups(model, 0.1), lr=1e-4)}
        assert optimizers["fused"].defaults["fused"] and not optimizers["default"].defaults["fused"]
        for optimizer in optimizers.values():
            optimizer.step()  # the moments are allocated on the first step
        ratios, seconds = [], {"fused": [], "default": []}
        for r in range(rounds):
            for side in ("fused", "default") if r % 2 == 0 else ("default", "fused"):
                t0 = time.perf_counter()
                for _ in range(repeats):
                    optimizers[side].step()
                seconds[side].append((time.perf_counter() - t0) / repeats)
            ratios.append(seconds["fused"][-1] / seconds["default"][-1])
        n = sum(p.numel() for p in model.parameters())
        print(f"  {label} ({n / 1e6:.1f}M parameters): fused {1e3 * statistics.median(seconds['fused']):.1f} ms, "
              f"default {1e3 * statistics.median(seconds['default']):.1f} ms a step; fused / default median "
              f"{statistics.median(ratios):.3f} (range {min(ratios):.3f} to {max(ratios):.3f})")
        figures.record(__file__, f"adamw_fused_{'demo' if not settings else 'gpt_100m'}", area="training",
                       figure=f"AdamW update time, {label} ({n / 1e6:.1f}M parameters)",
                       compared="fused (the torch engine's) / torch's default, in one process",
                       values=ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100, help="training steps per side per round")
    parser.add_argument("--skip-engines", action="store_true")
    parser.add_argument("--bare-only", action="store_true", help="(internal) one bare loop; print its tokens/s")
    args = parser.parse_args()
    if args.bare_only:
        cfg = bench_config(args.steps)
        seconds = bare_loop(cfg, args.steps)
        print(json.dumps({"tokens_per_s": args.steps * cfg.train.batch_size * cfg.model.block_size / seconds}))
        return 0

    print("== matmul peak (fp32, 2048^3, all cores)")
    peak = flops.store_peak(flops.measure_matmul_peak(n=2048, seconds=3.0))
    print(f"  {peak / 1e9:,.0f} GFLOP/s (cached for MFU in training runs)\n")

    cfg = bench_config(args.steps)
    tokens = args.steps * cfg.train.batch_size * cfg.model.block_size
    flops_per_token = training_flops_per_token(GPT(cfg.model), cfg.model)
    per_step = cfg.train.batch_size * cfg.model.block_size
    print(f"== the path a user runs: `python -m toolkit train demo` vs the bare loop in its own process, demo model, "
          f"{args.steps} steps x {per_step:,} tokens per side per round, interleaved")
    print(f"  {'round':>5} {'bare tok/s':>11} {'CLI tok/s':>14} {'ratio':>7}")
    cli_ratios, cpu_rounds = [], []
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-cli-") as tmp:
        for r in range(args.rounds):
            bare = bare_process(args.steps)
            cli, cpu = cli_process(args.steps, Path(tmp) / f"cli-{r}")
            cli_ratios.append(cli / bare)
            cpu_rounds.append(cpu)
            print(f"  {r + 1:>5} {bare:>11,.0f} {cli:>14,.0f} {cli / bare:>7.3f}", flush=True)
    cli_med = statistics.median(cli_ratios)
    print(f"  CLI / bare: median {cli_med:.3f} (range {min(cli_ratios):.3f} to {max(cli_ratios):.3f}); target >= 0.97 "
          f"-> {'PASS' if cli_med >= 0.97 else 'FAIL'}")
    figures.record(__file__, "cli_vs_bare", area="training", figure="training tokens/s, the path a user runs",
                   compared="`python -m toolkit train demo` / the bare loop in its own process", values=cli_ratios,
                   target=(">=", 0.97))
    # What the processes that only wait cost: each one's CPU seconds over its whole life (start-up included, so an
    # upper bound) against the run's training time, as a share of one core. Medians over the rounds.
    print(f"  CPU per process (median of {args.rounds} rounds; whole life, as a share of one core over the training "
          f"time):")
    for role in ("CLI follower", "supervisor", "worker"):
        shares = [c.get(role, 0.0) / c["train_seconds"] for c in cpu_rounds]
        seconds = statistics.median(c.get(role, 0.0) for c in cpu_rounds)
        print(f"    {role:<13} {seconds:7.2f} CPU s  {100 * statistics.median(shares):6.1f}% of a core")
    print()

    print(f"== in this process: the Trainer vs the bare loop, demo model, {args.steps} steps x {per_step:,} "
          f"tokens per side per round, {torch.get_num_threads()} threads, interleaved")
    print(f"  {'round':>5} {'bare tok/s':>11} {'toolkit tok/s':>14} {'ratio':>7}")
    ratios, bare_rates, toolkit_rates = [], [], []
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-") as tmp:
        for r in range(args.rounds):
            bare = tokens / bare_loop(cfg, args.steps)
            tk = tokens / toolkit_loop(cfg, Path(tmp), r)
            ratios.append(tk / bare)
            bare_rates.append(bare)
            toolkit_rates.append(tk)
            print(f"  {r + 1:>5} {bare:>11,.0f} {tk:>14,.0f} {tk / bare:>7.3f}", flush=True)
        med = statistics.median(ratios)
        print(f"  toolkit / bare: median {med:.3f} (range {min(ratios):.3f} to {max(ratios):.3f}); target >= 0.97 "
              f"-> {'PASS' if med >= 0.97 else 'FAIL'}")
        figures.record(__file__, "trainer_vs_bare", area="training", figure="training tokens/s, the loop alone",
                       compared="the Trainer / the bare loop, in one process", values=ratios, target=(">=", 0.97))
        for label, rates in (("bare", bare_rates), ("toolkit", toolkit_rates)):
            rate = statistics.median(rates)
            print(f"  MFU {label:<8} {100 * rate * flops_per_token / peak:5.1f}% "
                  f"({rate * flops_per_token / 1e9:,.0f} of {peak / 1e9:,.0f} GFLOP/s)")

        print()
        optimizer_step_comparison(args.rounds)

        if not args.skip_engines:
            print("\n== engines (demo model, through the launcher, steady-state tokens/s from events.jsonl)")
            rows = engine_comparison(max(60, args.steps // 2), Path(tmp))
            base = rows[0][1]
            for label, rate in rows:
                print(f"  {label:<36} {rate / base:>6.2f} x torch x1")
    return 0 if not math.isnan(med) else 1


if __name__ == "__main__":
    sys.exit(main())
