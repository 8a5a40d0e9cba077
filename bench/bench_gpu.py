"""Training throughput and MFU of a GPT-2-small-shaped model on one GPU, eager, bf16: the GPU check's benchmark.

    python bench/bench_gpu.py [--seconds 30] [--batch 64] [--json FILE] [--device cpu]

Toolkit's built-in GPT (toolkit.train.models.gpt) at GPT-2 small's shape: 12 blocks x 768 wide, 12 heads, context
1024, over bytes (vocabulary 256, so ~85M parameters, nearly all in the blocks). A bare loop (random bytes, bf16
autocast over fp32 weights, fused AdamW) trains it eager and compiled in place (torch.compile, as train.compile
does), after a warm-up that holds the compile: the two take turns, A B A B, for --seconds in all; tokens/s counts the
timed steps only, and compiled / eager is the median and range of the turn pairs (--eager-only: eager alone). MFU = tokens/s x training FLOPs per token (6N + attention, PaLM's appendix B, the toolkit's own
formula) over the GPU's peak: the dense bf16 datasheet figure where toolkit.train.flops knows the GPU, and the bf16
matmul peak measured here first, both reported.

Without a CUDA device it says "no CUDA device", writes that to --json and exits 0 at once: the check's report then
says so instead of failing. `--device cpu` runs the same loop on the CPU at a tiny shape, without MFU: a dry run of
the code the GPU machine runs, so its mistakes show up here and not in scarce GPU time.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPE = {"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024}
DRY_RUN_SHAPE = {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64}


def measured_bf16_peak(torch) -> float:
    """Best FLOP/s of a bf16 matmul on the current GPU: the toolkit's own measurement (what a run falls back to)."""
    from toolkit.train.flops import measure_device_matmul_peak

    return measure_device_matmul_peak(torch.device("cuda", torch.cuda.current_device()), "bf16", seconds=1.0)


def datasheet_peak(name: str) -> dict | None:
    """The toolkit's dense bf16 datasheet peak for this GPU, where its version of toolkit.train.flops has one."""
    from toolkit.train import flops

    lookup = getattr(flops, "datasheet_peak", None)
    return lookup(name, "bf16") if lookup else None


class Side:
    """One model trained by the bare loop: eager, or compiled in place (torch.compile, what train.compile does)."""

    def __init__(self, torch, device: str, cfg, batch: int, compiled: bool):
        from toolkit.train.models.gpt import GPT

        self.torch, self.device, self.cfg = torch, device, cfg
        torch.manual_seed(0)
        self.model = GPT(cfg).to(device)
        if compiled:
            self.model.compile()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1,
                                           fused=True)
        data = torch.randint(0, 256, (batch, cfg.block_size + 1), device=device)
        self.x, self.y = data[:, :-1], data[:, 1:]
        self.steps, self.seconds, self.loss = 0, 0.0, None

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def step(self):
        with self.torch.autocast(self.device, dtype=self.torch.bfloat16):
            loss = self.model(self.x, self.y)
        loss.backward()
        self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def warm_up(self) -> float:
        """cuBLAS chooses kernels, the allocator settles, a compiled model compiles: seconds it took."""
        t0 = time.perf_counter()
        for _ in range(5):
            self.step()
        self.sync()
        return time.perf_counter() - t0

    def timed(self, seconds: float) -> float:
        """Train for about ``seconds``, in chunks of 10 steps synchronised only between chunks (no host stall per
        step); adds to this side's totals and returns this stretch's steps per second."""
        steps, t0 = 0, time.perf_counter()
        while True:
            for _ in range(10):
                self.loss = self.step()
            steps += 10
            self.sync()
            if time.perf_counter() - t0 >= seconds:
                break
        elapsed = time.perf_counter() - t0
        self.steps, self.seconds = self.steps + steps, self.seconds + elapsed
        return steps / elapsed


def train(torch, device: str, shape: dict, batch: int, seconds: float, compiled: bool) -> dict:
    """Eager alone, or eager and compiled side by side: both warmed up (the compile timed), then timed in turns,
    A B A B, each for a quarter of ``seconds``; the ratio is per turn pair, median and range."""
    from toolkit import config as config_mod
    from toolkit.train.models.gpt import training_flops_per_token

    # GPT-2's GELU; dropout off, as in pretraining at scale
    cfg = config_mod.load(None, [f"model.{k}={v}" for k, v in shape.items()] + ["model.activation=gelu"]).model
    sides = {"eager": Side(torch, device, cfg, batch, compiled=False)}
    if compiled:
        sides["compiled"] = Side(torch, device, cfg, batch, compiled=True)
    warm = {name: side.warm_up() for name, side in sides.items()}
    rates: dict[str, list[float]] = {name: [] for name in sides}
    turns = 2 if compiled else 1
    for turn in range(turns):
        order = list(sides) if turn % 2 == 0 else list(sides)[::-1]
        for name in order:
            rates[name].append(sides[name].timed(seconds / (2 * turns) if compiled else seconds))
    eager = sides["eager"]
    tokens_per_step = batch * cfg.block_size
    result = {"model": {**shape, "vocab": 256, "activation": "gelu",
                        "parameters": sum(p.numel() for p in eager.model.parameters())},
              "batch": batch, "tokens_per_step": tokens_per_step, "steps": eager.steps,
              "seconds": round(eager.seconds, 2), "step_ms": round(1e3 * eager.seconds / eager.steps, 2),
              "tokens_per_s": round(eager.steps * tokens_per_step / eager.seconds),
              "flops_per_token": training_flops_per_token(eager.model, cfg),
              "final_loss": round(float(eager.loss.detach()), 4),
              "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None}
    if compiled:
        c = sides["compiled"]
        ratios = [b / a for a, b in zip(rates["eager"], rates["compiled"])]
        result["compiled"] = {"tokens_per_s": round(c.steps * tokens_per_step / c.seconds),
                              "step_ms": round(1e3 * c.seconds / c.steps, 2), "steps": c.steps,
                              "compile_s": round(warm["compiled"] - warm["eager"], 1),
                              "final_loss": round(float(c.loss.detach()), 4),
                              "over_eager_median": round(statistics.median(ratios), 3),
                              "over_eager_range": [round(min(ratios), 3), round(max(ratios), 3)]}
    return result


def run(seconds: float, batch: int, device: str, compiled: bool = True) -> dict:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - the report says why, whatever it is
        return {"status": "no CUDA device", "reason": f"torch not importable: {exc!r}"}
    result = {"status": "no CUDA device", "torch": torch.__version__, "cuda": torch.version.cuda}
    if device == "cuda" and not torch.cuda.is_available():
        return result
    if device == "cuda":
        name, shape = torch.cuda.get_device_name(), SHAPE
        measured, sheet = measured_bf16_peak(torch), datasheet_peak(name)
    else:
        name, shape, measured, sheet = "cpu (dry run of the GPU path, tiny shape)", DRY_RUN_SHAPE, None, None
    result.update(status="ok", device=name, precision="bf16 autocast, fp32 weights", compile=compiled)
    result["peak_bf16_measured_flops"] = measured
    result["peak_bf16_datasheet_flops"] = sheet["flops"] if sheet else None
    while True:
        try:
            result.update(train(torch, device, shape, batch, seconds, compiled))
            break
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            if batch == 1:
                raise
            result.setdefault("notes", []).append(f"batch {batch} ran out of memory; halved")
            batch //= 2
    for figures in (result, result.get("compiled")):
        if figures is None:
            continue
        achieved = figures["tokens_per_s"] * result["flops_per_token"]
        figures["mfu_vs_measured"] = round(achieved / measured, 4) if measured else None
        figures["mfu_vs_datasheet"] = round(achieved / sheet["flops"], 4) if sheet else None
        figures["mfu"] = figures["mfu_vs_datasheet"] if sheet else figures["mfu_vs_measured"]
    if not math.isfinite(result["final_loss"]):
        result["status"] = "error"
        result["reason"] = "the loss is not finite"
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="timed training, after the warm-up")
    # MFU rises with the batch (16 -> 64 on an H200: bench/results/2026-11-27T2205-h200/mfu_probe.jsonl); 64 fits 80 GB
    parser.add_argument("--batch", type=int, default=64, help="sequences of 1024 tokens per step")
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run at a tiny shape")
    parser.add_argument("--eager-only", action="store_true", help="leave out the compiled side (and its compile)")
    args = parser.parse_args()
    try:
        result = run(args.seconds, args.batch, args.device, compiled=not args.eager_only)
    except Exception as exc:  # noqa: BLE001 - a failed benchmark is a finding for the report, not a crash
        result = {"status": "error", "reason": f"{type(exc).__name__}: {exc}"}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    if result["status"] == "ok":
        mfu = (f"MFU {result['mfu']:.1%} (vs measured bf16 peak {result['mfu_vs_measured']:.1%}, "
               f"{result['peak_bf16_measured_flops'] / 1e12:.0f} TFLOP/s)") if result["mfu"] is not None else "no MFU"
        print(f"{result['device']}: {result['tokens_per_s']:,} tokens/s, step {result['step_ms']} ms, {mfu}, "
              f"peak memory {result['peak_memory_gib'] or 'n/a'} GiB, final loss {result['final_loss']}")
        if c := result.get("compiled"):
            mfu = f"MFU {c['mfu']:.1%}" if c["mfu"] is not None else "no MFU"
            print(f"compiled: {c['tokens_per_s']:,} tokens/s, step {c['step_ms']} ms, {mfu}; "
                  f"{c['over_eager_median']:.3f}x eager (range {c['over_eager_range'][0]:.3f} to "
                  f"{c['over_eager_range'][1]:.3f}), compile {c['compile_s']} s")
    else:
        print(f"bench_gpu: {result['status']}{': ' + result['reason'] if result.get('reason') else ''}")
    return 0 if result["status"] in ("ok", "no CUDA device") else 1


if __name__ == "__main__":
    sys.exit(main())
