"""Checkpoint cost: how long training is blocked, Trainbook vs a synchronous torch.save vs DCP async_save.

    python bench/bench_checkpoint.py [--rounds 5] [--layers 14] [--width 768]

1. A ~100M-parameter GPT with AdamW state (~1.2 GB to save), one process. Each round trains a step and then
   checkpoints the same state three ways, interleaved (A B C, A B C, ...), on the same disk:
     A  torch.save of model + optimizer state dicts (training waits for all of it)
     B  torch.distributed.checkpoint.async_save (training waits until it returns)
     C  Trainbook's Checkpointer, as the trainer uses it: references now, staged behind the next
        forward/backward, waited for only before the next optimizer step
   Target: C blocks for at most 1/50 of A. Reported: median of per-round ratios, with the range.
2. Throughput of the demo model with checkpoints every N steps vs none (in-process Trainer, interleaved).
   Target: >= 0.98.
3. Time from a SIGKILL to the first resumed step, through the supervisor (--max-restarts 1).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolkit import config as config_mod  # noqa: E402
from toolkit import data as data_mod  # noqa: E402
from toolkit import launch  # noqa: E402
from toolkit.checkpointer import Checkpointer  # noqa: E402
from toolkit.distributed import Topology  # noqa: E402
from toolkit.engines.torch_engine import TorchEngine  # noqa: E402
from toolkit.models.gpt import GPT  # noqa: E402
from toolkit.ports import free_port  # noqa: E402
from toolkit.rundir import RunDir  # noqa: E402
from toolkit.trainer import Trainer  # noqa: E402


def ratio_line(label: str, ratios: list[float], target: str) -> str:
    return (f"  {label}: median {statistics.median(ratios):,.3g} (range {min(ratios):,.3g} to {max(ratios):,.3g}); "
            f"{target}")


def blocking_comparison(rounds: int, layers: int, width: int, workdir: Path) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    cfg = config_mod.load("demo", [f"model.n_layer={layers}", f"model.n_embd={width}", "model.n_head=12",
                                   "model.block_size=64", "train.batch_size=2", "checkpoint.mode=async",
                                   "checkpoint.keep_last=1", "checkpoint.every_steps=1"])
    torch.manual_seed(0)
    engine = TorchEngine(GPT(cfg.model), cfg, Topology(0, 0, 1, torch.device("cpu")))
    n_params = sum(p.numel() for p in engine.module.parameters())
    corpus = data_mod.load_corpus(cfg)
    generator = torch.Generator().manual_seed(0)

    def step(before_update=None):
        x, y = corpus.batch("train", cfg.train.batch_size, generator)
        return engine.train_step(x, y, before_update=before_update)

    step()  # AdamW creates its moment buffers on the first step: now the state is full size
    state_bytes = sum(t.numel() * t.element_size() for t in engine.module.state_dict().values())
    state_bytes += sum(v.numel() * v.element_size() for s in engine.optimizer.state.values()
                       for v in s.values() if torch.is_tensor(v))
    run_dir = workdir / "ckpt-run"
    run_dir.mkdir()
    checkpointer = Checkpointer(cfg, run_dir, rank=0, world_size=1, engine=engine)
    checkpointer.warm_up()  # as the trainer does after its first step
    print(f"== blocking per checkpoint: {n_params / 1e6:.1f}M parameters + AdamW = {state_bytes / 2**30:.2f} GiB, "
          f"1 process, {rounds} interleaved rounds")
    print(f"  {'round':>5} {'torch.save s':>13} {'DCP async s':>12} {'Trainbook ms':>13} {'save/TB':>9} "
          f"{'DCP/TB':>8} {'persist s':>10} {'step s':>7}")
    sync_ratios, dcp_ratios = [], []
    for r in range(rounds):
        step()
        t0 = time.perf_counter()
        torch.save({"model": engine.module.state_dict(), "optimizer": engine.optimizer.state_dict()},
                   workdir / "sync.pt")
        sync_s = time.perf_counter() - t0

        step()
        model_sd, optim_sd = get_state_dict(engine.module, engine.optimizer)
        t0 = time.perf_counter()
        future = dcp.async_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(workdir / f"dcp-{r}"))
        dcp_s = time.perf_counter() - t0
        future.result()

        step()
        checkpointer.save(r + 1, {"step": r + 1, "horizon": 0, "train_seconds": 0.0})
        t0 = time.perf_counter()
        step(before_update=checkpointer.before_update)  # the forward/backward the staging hides behind
        step_s = time.perf_counter() - t0
        job = checkpointer._pending
        job.done.wait()
        persist_s = time.perf_counter() - job.started
        blocked = job.blocked_s
        sync_ratios.append(sync_s / blocked)
        dcp_ratios.append(dcp_s / blocked)
        print(f"  {r + 1:>5} {sync_s:>13.3f} {dcp_s:>12.3f} {1e3 * blocked:>13.2f} {sync_s / blocked:>9,.0f} "
              f"{dcp_s / blocked:>8,.0f} {persist_s:>10.2f} {step_s:>7.2f}", flush=True)
        shutil.rmtree(workdir / f"dcp-{r}", ignore_errors=True)
    checkpointer.close()
    dist.destroy_process_group()
    med = statistics.median(sync_ratios)
    print(ratio_line("torch.save blocking / Trainbook blocking", sync_ratios,
                     f"target >= 50 -> {'PASS' if med >= 50 else 'FAIL'}"))
    print(ratio_line("DCP async_save blocking / Trainbook blocking", dcp_ratios, "for reference"))


def throughput_with_checkpoints(rounds: int, steps: int, every: int, workdir: Path) -> None:
    print(f"\n== demo model throughput, checkpoint every {every} steps vs none ({steps} steps per side, "
          f"{rounds} interleaved rounds)")
    ratios = []
    for r in range(rounds):
        seconds = {}
        for label, extra in (("none", ["checkpoint.every_steps=0"]),
                             ("every", [f"checkpoint.every_steps={every}"])):
            cfg = config_mod.load("demo", [f"train.max_steps={steps}", "train.max_seconds=0",
                                           "profile.enabled=false", f"train.eval_every={steps}",
                                           "train.eval_batches=1", "checkpoint.at_end=false", *extra])
            trainer = Trainer(RunDir.create(workdir / f"tp-{label}-{r}", cfg))
            t0 = time.perf_counter()
            trainer.train()
            seconds[label] = time.perf_counter() - t0
            trainer.close()
            blocking = [e["blocking_ms"] for e in RunDir(workdir / f"tp-{label}-{r}").events("checkpoint")]
        ratios.append(seconds["none"] / seconds["every"])
        print(f"  round {r + 1}: {seconds['none']:.2f} s without, {seconds['every']:.2f} s with "
              f"({len(blocking)} checkpoints, median blocking {statistics.median(blocking):.2f} ms) "
              f"-> ratio {ratios[-1]:.3f}", flush=True)
    med = statistics.median(ratios)
    print(ratio_line("tokens/s with / without checkpoints", ratios, f"target >= 0.98 -> {'PASS' if med >= 0.98 else 'FAIL'}"))


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
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainbook-ckpt-bench-") as tmp:
        blocking_comparison(args.rounds, args.layers, args.width, Path(tmp))
        throughput_with_checkpoints(args.rounds, args.throughput_steps, args.every, Path(tmp))
        kill_to_resume(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
