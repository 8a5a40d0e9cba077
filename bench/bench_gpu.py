"""Training throughput and MFU of a GPT-2-small-shaped model on one GPU, eager, bf16: the GPU check's benchmark.

    python bench/bench_gpu.py [--seconds 30] [--batch 16] [--json FILE] [--device cpu]

Toolkit's built-in GPT (toolkit.train.models.gpt) at GPT-2 small's shape: 12 blocks x 768 wide, 12 heads, context
1024, over bytes (vocabulary 256, so ~85M parameters, nearly all in the blocks). A bare loop (random bytes, bf16
autocast over fp32 weights, fused AdamW, no torch.compile) trains for --seconds after a warm-up; tokens/s counts the
timed steps only. MFU = tokens/s x training FLOPs per token (6N + attention, PaLM's appendix B, the toolkit's own
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


def train(torch, device: str, shape: dict, batch: int, seconds: float) -> dict:
    from toolkit import config as config_mod
    from toolkit.train.models.gpt import GPT, training_flops_per_token

    # GPT-2's GELU; dropout off, as in pretraining at scale
    cfg = config_mod.load(None, [f"model.{k}={v}" for k, v in shape.items()] + ["model.activation=gelu"]).model
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=device == "cuda")
    data = torch.randint(0, 256, (batch, cfg.block_size + 1), device=device)
    x, y = data[:, :-1], data[:, 1:]
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for _ in range(5):  # cuBLAS/cuDNN choose kernels, the allocator settles
        step()
    sync()
    steps, t0 = 0, time.perf_counter()
    while True:  # in chunks of 10, synchronising only between chunks: no host stall per step
        for _ in range(10):
            loss = step()
        steps += 10
        sync()
        if time.perf_counter() - t0 >= seconds:
            break
    elapsed = time.perf_counter() - t0
    tokens_per_s = steps * batch * cfg.block_size / elapsed
    n_params = sum(p.numel() for p in model.parameters())
    peak_memory = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"model": {**shape, "vocab": 256, "activation": "gelu", "parameters": n_params},
            "batch": batch, "tokens_per_step": batch * cfg.block_size, "steps": steps,
            "seconds": round(elapsed, 2), "step_ms": round(1e3 * elapsed / steps, 2),
            "tokens_per_s": round(tokens_per_s), "flops_per_token": training_flops_per_token(model, cfg),
            "final_loss": round(float(loss.detach()), 4),
            "peak_memory_gib": round(peak_memory, 2) if peak_memory else None}


def run(seconds: float, batch: int, device: str) -> dict:
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
    result.update(status="ok", device=name, precision="bf16 autocast, fp32 weights", compile=False)
    result["peak_bf16_measured_flops"] = measured
    result["peak_bf16_datasheet_flops"] = sheet["flops"] if sheet else None
    while True:
        try:
            result.update(train(torch, device, shape, batch, seconds))
            break
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            if batch == 1:
                raise
            result.setdefault("notes", []).append(f"batch {batch} ran out of memory; halved")
            batch //= 2
    achieved = result["tokens_per_s"] * result["flops_per_token"]
    result["mfu_vs_measured"] = round(achieved / measured, 4) if measured else None
    result["mfu_vs_datasheet"] = round(achieved / sheet["flops"], 4) if sheet else None
    result["mfu"] = result["mfu_vs_datasheet"] if sheet else result["mfu_vs_measured"]
    if not math.isfinite(result["final_loss"]):
        result["status"] = "error"
        result["reason"] = "the loss is not finite"
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="timed training, after the warm-up")
    parser.add_argument("--batch", type=int, default=16, help="sequences of 1024 tokens per step")
    parser.add_argument("--json", type=Path, help="write the result here too")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a dry run at a tiny shape")
    args = parser.parse_args()
    try:
        result = run(args.seconds, args.batch, args.device)
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
    else:
        print(f"bench_gpu: {result['status']}{': ' + result['reason'] if result.get('reason') else ''}")
    return 0 if result["status"] in ("ok", "no CUDA device") else 1


if __name__ == "__main__":
    sys.exit(main())
