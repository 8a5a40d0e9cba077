"""Checkpoint cost: the training time a checkpoint loses, Trainbook vs a synchronous torch.save vs DCP async_save.

    python bench/bench_checkpoint.py [--rounds 5] [--layers 14] [--width 768]

1. A ~100M-parameter GPT with AdamW state (~1.2 GB to save), one process. Each round checkpoints the same
   state each way, interleaved (A B C D, A B C D, ...), on the same disk, with whole-step accounting:
       lost = (the checkpoint call + every step until its background work is done + 2 more steps)
              - (that many steps at the median of the 4 plain steps measured just before)
   so a checkpoint's after-effects on the steps it overlaps count, not only the time the call blocks.
     A  torch.save of model + optimizer state dicts (what a hand-written loop does; no fsync)
     B  torch.distributed.checkpoint.async_save (returns after staging; writes in a background thread)
     C  Trainbook's Checkpointer as the trainer uses it on CPU (checkpoint.stage=auto: blocking copy with every
        core, write + checksum in a low-priority thread, O_DIRECT)
     D  the same with checkpoint.stage=overlap (copy on one background core behind the next forward/backward)
   Target: C loses at most 0.5x what A loses (median of per-round ratios, with the range). The floor printed
   is the CPU work no checkpoint can avoid (copy, checksum, write), measured alone.
2. Throughput of the same model with checkpoints at the advisor's interval (C = C's measured loss, MTBF stated)
   vs none, through the Trainer (in process, interleaved). Target: >= 0.98.
3. The demo model's throughput with checkpoints every N steps vs none (in-process Trainer, interleaved).
4. Time from a SIGKILL to the first resumed step, through the supervisor (--max-restarts 1).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import figures  # noqa: E402
from toolkit import config as config_mod  # noqa: E402
from toolkit.data import corpus as data_mod  # noqa: E402
from toolkit.runs import launch  # noqa: E402
from toolkit.checkpoint.interval_advisor import advise  # noqa: E402
from toolkit.checkpoint.checkpointer import Checkpointer, _without_zip_crc32  # noqa: E402
from toolkit.checkpoint.checksum import ChecksummedWriter, bounce_buffer  # noqa: E402
from toolkit.train.distributed import Topology  # noqa: E402
from toolkit.train.engines.torch_engine import TorchEngine  # noqa: E402
from toolkit.train.models import loss_function  # noqa: E402
from toolkit.train.models.gpt import GPT  # noqa: E402
from toolkit.train.trainer import train_step  # noqa: E402
from toolkit.ports import free_port  # noqa: E402
from toolkit.rundir import RunDir  # noqa: E402
from toolkit.train.trainer import Trainer  # noqa: E402

PLAIN_STEPS = 4   # measured just before each checkpoint: its median is the step time the excess is counted over
SETTLE_STEPS = 2  # counted after the background work is done: after-effects (evicted caches) show up there


def ratio_line(label: str, ratios: list[float], target: str) -> str:
    return (f"  {label}: median {statistics.median(ratios):,.3g} (range {min(ratios):,.3g} to {max(ratios):,.3g}); "
            f"{target}")


def big_model_config(layers: int, width: int, extra=()):
    return config_mod.load("demo", [f"model.n_layer={layers}", f"model.n_embd={width}", "model.n_head=12",
                                    "model.block_size=64", "train.batch_size=2", "checkpoint.keep_last=1", *extra])


def lost_time_comparison(rounds: int, layers: int, width: int, workdir: Path) -> float:
    """Section 1; returns the median training time Trainbook loses per checkpoint (seconds)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    cfg = big_model_config(layers, width)
    torch.manual_seed(0)
    engine = TorchEngine(GPT(cfg.model), cfg, Topology(0, 0, 1, torch.device("cpu")), loss_function(cfg.model))
    n_params = sum(p.numel() for p in engine.module.parameters())
    corpus = data_mod.load_corpus(cfg)
    generator = torch.Generator().manual_seed(0)

    def step(before_update=None) -> float:
        t0 = time.perf_counter()
        train_step(engine, [corpus.batch("train", cfg.train.batch_size, generator)], before_update=before_update)
        return time.perf_counter() - t0

    step()  # AdamW creates its moment buffers on the first step: now the state is full size
    state_bytes = sum(t.numel() * t.element_size() for t in engine.module.state_dict().values())
    state_bytes += sum(v.numel() * v.element_size() for s in engine.optimizer.state.values()
                       for v in s.values() if torch.is_tensor(v))
    checkpointers = {}
    for label, stage in (("C", "auto"), ("D", "overlap")):
        run_dir = workdir / f"ckpt-{stage}"
        run_dir.mkdir()
        ccfg = big_model_config(layers, width, ["checkpoint.mode=async", f"checkpoint.stage={stage}",
                                                    "checkpoint.every_steps=1"])
        checkpointers[label] = Checkpointer(ccfg, run_dir, rank=0, world_size=1, engine=engine,
                                            device=torch.device("cpu"))
        checkpointers[label].fill_staging_buffers()  # every round measures a checkpoint into staging buffers in use
        checkpointers[label]._pending.done.wait()
    ledger_lost = {"C": [], "D": []}

    def with_trainbook(label: str, r: int):
        ckpt = checkpointers[label]
        reported = []
        ckpt.on_event = lambda **e: reported.append(e["lost_ms"] / 1e3)
        t0 = time.perf_counter()
        ckpt.save(r + 1, {"step": r + 1, "horizon": 0, "train_seconds": 0.0})
        unreported = [time.perf_counter() - t0]  # in the trainer, the saving step's time holds the save call
        job = ckpt._pending
        yield job.done.is_set

        def step_and_tell() -> float:
            seconds = step(ckpt.before_update)
            ckpt.step_done(seconds + sum(unreported))
            unreported.clear()
            return seconds
        yield step_and_tell

        def wrap_up():
            cost = ckpt.ledger.finish()  # None when a settled step already closed the window (and reported it)
            ledger_lost[label].append(reported[-1] if reported else cost.lost_s if cost else None)
        yield wrap_up

    def with_torch_save(r: int):
        torch.save({"model": engine.module.state_dict(), "optimizer": engine.optimizer.state_dict()},
                   workdir / "sync.pt")
        yield lambda: True
        yield step
        yield os.sync  # not timed: its dirty pages must not be flushed during the next method's steps

    def with_dcp(r: int):
        model_sd, optim_sd = get_state_dict(engine.module, engine.optimizer)
        future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(workdir / f"dcp-{r}"))
        yield future.done
        yield step
        yield lambda: (future.result(), shutil.rmtree(workdir / f"dcp-{r}", ignore_errors=True))

    methods = {"A": with_torch_save, "B": with_dcp, "C": lambda r: with_trainbook("C", r),
               "D": lambda r: with_trainbook("D", r)}
    names = {"A": "torch.save", "B": "DCP async", "C": "Trainbook", "D": "TB overlap"}

    def lost_by(method, r: int) -> tuple[float, float, int]:
        plain_steps = []
        for _ in range(PLAIN_STEPS):
            plain_steps.append(step())
            for c in checkpointers.values():  # their ledgers take the plain step time from these too
                c.step_done(plain_steps[-1])
        plain = statistics.median(plain_steps)
        t0 = time.perf_counter()
        actions = method(r)
        background_done = next(actions)  # the checkpoint call has returned
        blocked = time.perf_counter() - t0
        one_step = next(actions)
        steps = 0
        while not background_done():
            one_step()
            steps += 1
        for _ in range(SETTLE_STEPS):
            one_step()
            steps += 1
        total = time.perf_counter() - t0
        next(actions)  # wrap up (not counted: training would go on)
        return total - steps * plain, blocked, steps

    print(f"== training time lost per checkpoint: {n_params / 1e6:.1f}M parameters + AdamW = "
          f"{state_bytes / 2**30:.2f} GiB, 1 process, {rounds} interleaved rounds, whole-step accounting")
    print("  " + " ".join(f"{names[k] + ' lost s':>17}" for k in methods) + f"{'TB blocked ms':>14}{'TB/save':>9}"
          f"{'overlap/save':>13}{'step s':>8}")
    lost: dict[str, list[float]] = {k: [] for k in methods}
    blocked_c, ratios, overlap_ratios = [], [], []
    for r in range(rounds):
        measured = {}
        for key, method in methods.items():
            measured[key] = lost_by(method, r)
            lost[key].append(measured[key][0])
        blocked_c.append(measured["C"][1])
        ratios.append(measured["C"][0] / measured["A"][0])
        overlap_ratios.append(measured["D"][0] / measured["A"][0])
        print("  " + " ".join(f"{measured[k][0]:>17.3f}" for k in methods) + f"{1e3 * measured['C'][1]:>14.1f}"
              f"{ratios[-1]:>9.3f}{overlap_ratios[-1]:>13.3f}{step():>8.2f}", flush=True)
    for c in checkpointers.values():
        c.close()

    floor_s, floor_text = unavoidable_work(checkpointers["C"], workdir)
    dist.destroy_process_group()
    med = statistics.median(ratios)
    print(ratio_line("Trainbook lost / torch.save lost", ratios, f"target <= 0.5 -> {'PASS' if med <= 0.5 else 'FAIL'}"))
    figures.record(__file__, "lost_vs_torch_save", area="checkpoints", figure="training time lost per checkpoint",
                   compared=f"Trainbook / torch.save, {n_params / 1e6:.0f}M parameters + AdamW, whole-step accounting",
                   values=ratios, target=("<=", 0.5))
    print(ratio_line("Trainbook (stage=overlap) lost / torch.save lost", overlap_ratios,
                     "why checkpoint.stage=auto copies with every core on CPU"))
    print(ratio_line("DCP async_save lost / torch.save lost", [b / a for a, b in zip(lost["A"], lost["B"])],
                     "for reference"))
    measured = [x for x in ledger_lost["C"] if x is not None]
    if measured:
        print(f"  the checkpointer's own lost_ms (what runs record) for C: median {statistics.median(measured):.3f} s "
              f"vs this bench's {statistics.median(lost['C']):.3f} s")
    print(f"  floor: {floor_text} -> at least {floor_s:.3f} s lost per checkpoint "
          f"(Trainbook median {statistics.median(lost['C']):.3f} s; median blocked "
          f"{1e3 * statistics.median(blocked_c):.0f} ms)")
    return statistics.median(lost["C"])


def unavoidable_work(checkpointer: Checkpointer, workdir: Path) -> tuple[float, str]:
    """The CPU work a checkpoint of this state cannot avoid, each part measured alone on the staged copy:
    the copy (with every core, while training waits) and the checksum + write (one core, in the background;
    with training on every core it displaces ~1/cores of its time)."""
    cores = torch.get_num_threads()
    tensors = [t for t in checkpointer._buffers.values()]
    src = [t.clone() for t in tensors]
    t0 = time.perf_counter()
    for dst, s in zip(tensors, src):
        dst.copy_(s)
    copy_s = time.perf_counter() - t0
    del src
    bounce = bounce_buffer()
    r0 = resource.getrusage(resource.RUSAGE_THREAD)
    writer = ChecksummedWriter(workdir / "floor.pt", bounce)
    with _without_zip_crc32():
        torch.save(tensors, writer)
    writer.close()
    r1 = resource.getrusage(resource.RUSAGE_THREAD)
    write_cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    (workdir / "floor.pt").unlink()
    floor = copy_s + write_cpu / cores
    return floor, (f"copy {copy_s:.3f} s on {cores} cores + checksum and O_DIRECT write {write_cpu:.3f} CPU-s "
                   f"/ {cores} cores")


def throughput_at_advised_interval(rounds: int, layers: int, width: int, lost_s: float, mtbf_s: float,
                                   workdir: Path) -> None:
    cfg = big_model_config(layers, width)
    probe = Trainer(RunDir.create(workdir / "probe", _trainer_config(cfg, 6, 0)))
    t0 = time.perf_counter()
    probe.train()
    step_s = (time.perf_counter() - t0) / 6
    probe.close()
    advice = advise(cost_s=max(lost_s, 1e-3), mtbf_s=mtbf_s, step_time_s=step_s)
    every = advice.interval_steps
    steps = 2 * every + 2  # two checkpoints, and the second one's background work mostly inside the timing
    print(f"\n== {layers} x {width} model throughput with checkpoints at the advisor's interval vs none: "
          f"C = {lost_s:.3f} s lost (section 1), MTBF assumed {mtbf_s / 3600:.1f} h (a job of "
          f"~{50_700 * 3600 / mtbf_s:,.0f} GPUs at Llama 3's failure rate; shorter than most, so that the interval "
          f"fits in a benchmark) -> every {advice.interval_s:.0f} s = {every} steps; {steps} steps per side, "
          f"{rounds} interleaved rounds")
    with_vs_without(rounds, {"without": _trainer_config(cfg, steps, 0), "with": _trainer_config(cfg, steps, every)},
                    workdir / "advised", "advised_interval",
                    f"{layers} x {width} model, checkpoints at the advisor's interval ({every} steps)")


def with_vs_without(rounds: int, configs: dict, workdir: Path, key: str, figure: str) -> None:
    """Train each config of {"without": ..., "with": ...} in process, interleaved A B B A (each round reverses the
    order, so that a drift of the machine's speed, or what one run leaves to the next, favours neither side), and
    compare the times."""
    ratios = []
    for r in range(rounds):
        seconds, events = {}, []
        for label in (list(configs) if r % 2 == 0 else list(configs)[::-1]):
            run = RunDir.create(workdir / f"{label}-{r}", configs[label])
            trainer = Trainer(run)
            t0 = time.perf_counter()
            trainer.train()
            seconds[label] = time.perf_counter() - t0
            trainer.close()
            events += run.events("checkpoint")
            shutil.rmtree(run.path / "checkpoints", ignore_errors=True)
        ratios.append(seconds["without"] / seconds["with"])
        if not events:
            raise SystemExit(f"no checkpoint was written in {workdir} (is --every below the steps per side?)")
        lost, blocked = (statistics.median(e[k] for e in events) for k in ("lost_ms", "blocking_ms"))
        # what the checkpoints' own accounting predicts: the plain run plus the time each says it lost
        predicted = seconds["without"] / (seconds["without"] + sum(e["lost_ms"] for e in events) / 1000)
        print(f"  round {r + 1}: {seconds['without']:.2f} s without, {seconds['with']:.2f} s with {len(events)} "
              f"checkpoints (median lost {lost:,.1f} ms, of which blocked {blocked:,.1f} ms) -> ratio "
              f"{ratios[-1]:.3f} (their lost time predicts {predicted:.3f})", flush=True)
    med = statistics.median(ratios)
    print(ratio_line("tokens/s with / without checkpoints", ratios, f"target >= 0.98 -> {'PASS' if med >= 0.98 else 'FAIL'}"))
    figures.record(__file__, key, area="checkpoints", figure=figure, compared="tokens/s with / without checkpoints",
                   values=ratios, target=(">=", 0.98))


def _trainer_config(cfg, steps: int, every: int):
    import dataclasses

    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, max_steps=steps, max_seconds=0, eval_every=10 * steps,
                                       eval_batches=1, log_every=max(1, steps // 4)),
        profile=dataclasses.replace(cfg.profile, enabled=False),
        checkpoint=dataclasses.replace(cfg.checkpoint, every_steps=every, at_end=False))


def throughput_with_checkpoints(rounds: int, steps: int, every: int, workdir: Path) -> None:
    print(f"\n== demo model throughput, checkpoint every {every} steps vs none ({steps} steps per side, "
          f"{rounds} interleaved rounds)")
    configs = {label: config_mod.load("demo", [f"train.max_steps={steps}", "train.max_seconds=0",
                                               "profile.enabled=false", f"train.eval_every={steps}",
                                               "train.eval_batches=1", "checkpoint.at_end=false",
                                               f"checkpoint.every_steps={n}"])
               for label, n in (("without", 0), ("with", every))}
    with_vs_without(rounds, configs, workdir / "demo", "demo_every", f"demo model, a checkpoint every {every} steps")


def kill_to_resume(workdir: Path) -> None:
    print("\n== time from SIGKILL to the first resumed step (demo model, supervisor, --max-restarts 1)")
    cfg = config_mod.load("demo", ["train.max_steps=120", "train.max_seconds=0", "profile.enabled=false",
                                   "train.log_every=1", "checkpoint.every_steps=50", "fault.kill_at_step=75",
                                   "train.eval_every=1000", "train.eval_batches=1"])
    handle = launch.start(cfg, run_dir=workdir / "kill", max_restarts=1)
    if handle.wait() != 0:
        raise SystemExit(f"kill/resume run failed: see {handle.path / launch.LOG_NAME}")
    events = handle.run.events()
    restart = next(e for e in events if e["event"] == "restart")
    killed_after = max(e["time"] for e in events if e["event"] == "train" and e["time"] < restart["time"])
    first = next(e for e in events if e["event"] == "train" and e["time"] > restart["time"])
    print(f"  killed after step 75 at t=0; supervisor saw it at +{restart['time'] - killed_after:.2f} s; "
          f"resumed from step {restart['from_step']}; first resumed step ({first['step']}) done at "
          f"+{first['time'] - killed_after:.2f} s (process start, imports, checkpoint verify + load, one step)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--layers", type=int, default=14, help="14 x 768 wide = ~100M parameters")
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--throughput-steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--mtbf-hours", type=float, default=0.5, help="the failure-rate assumption of section 2")
    parser.add_argument("--throughput-rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainbook-ckpt-bench-") as tmp:
        lost_s = lost_time_comparison(args.rounds, args.layers, args.width, Path(tmp))
        throughput_at_advised_interval(args.throughput_rounds, args.layers, args.width, lost_s,
                                       args.mtbf_hours * 3600, Path(tmp))
        throughput_with_checkpoints(args.rounds, args.throughput_steps, args.every, Path(tmp))
        kill_to_resume(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
