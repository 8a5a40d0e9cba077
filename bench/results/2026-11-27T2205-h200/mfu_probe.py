"""Where GPT-2 small's MFU goes on one GPU: a few variants of the bare loop, each warmed up then timed, one JSON line
each (printed as it finishes, so a cut-off run still reports what it measured).

    python bench/gpu_mfu_probe.py [--seconds 10] [--device cpu] [--only NAME ...]

Variants: the built-in GPT (vocabulary 256) at batch 16 and 32, and transformers' GPT2LMHeadModel at GPT-2 small's
real shape (vocabulary 50304, as nanoGPT pads it), all bf16 autocast over fp32 weights, fused AdamW, compiled.
MFU = tokens/s x (6N + 12 L d T) / the datasheet bf16 peak, N without the position table (nanoGPT's estimate_mfu).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODE = None  # torch.compile mode: --mode
PEAK = {"H100": 989e12, "H200": 989e12, "A100": 312e12}


def peak(torch) -> float | None:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return next((flops for key, flops in PEAK.items() if key in name), None)


def builtin(torch, device, shape, batch):
    from toolkit import config as config_mod
    from toolkit.train.models.gpt import GPT

    cfg = config_mod.load(None, [f"model.{k}={v}" for k, v in shape.items()] + ["model.activation=gelu"]).model
    model = GPT(cfg).to(device)
    x = torch.randint(0, 256, (batch, shape["block_size"] + 1), device=device)
    return model, (lambda: model(x[:, :-1], x[:, 1:])), model.wpe.weight.numel()


def hf_gpt2(torch, device, shape, batch):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=50304, n_positions=shape["block_size"], n_embd=shape["n_embd"],
                        n_layer=shape["n_layer"], n_head=shape["n_head"], resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, attn_implementation="sdpa")
    model = GPT2LMHeadModel(config).to(device)
    x = torch.randint(0, 50257, (batch, shape["block_size"]), device=device)
    return model, (lambda: model(input_ids=x, labels=x).loss), model.transformer.wpe.weight.numel()


VARIANTS = {  # name: (builder, batch)
    "builtin-b16": (builtin, 16),
    "hf-gpt2-b16": (hf_gpt2, 16),
    "builtin-b32": (builtin, 32),
    "hf-gpt2-b32": (hf_gpt2, 32),
    "builtin-b64": (builtin, 64),
}


def measure(torch, device, shape, name, seconds, compiled) -> dict:
    build, batch = VARIANTS[name]
    if device == "cpu":
        batch = 2
    torch.manual_seed(0)
    model, loss_fn, wpe = build(torch, device, shape, batch)
    if compiled:
        model.compile(mode=MODE)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=device == "cuda")

    def step():
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = loss_fn()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(5):
        step()
    sync()
    warm = time.perf_counter() - t0
    steps, t0 = 0, time.perf_counter()
    while True:
        for _ in range(10):
            loss = step()
        steps += 10
        sync()
        if time.perf_counter() - t0 >= seconds:
            break
    elapsed = time.perf_counter() - t0
    n = sum(p.numel() for p in model.parameters()) - wpe
    flops_per_token = 6 * n + 12 * shape["n_layer"] * shape["n_embd"] * shape["block_size"]
    tokens_per_s = steps * batch * shape["block_size"] / elapsed
    p = peak(torch)
    return {"variant": name, "batch": batch, "compiled": compiled, "params_no_wpe": n, "warm_s": round(warm, 1),
            "step_ms": round(1e3 * elapsed / steps, 2), "tokens_per_s": round(tokens_per_s),
            "mfu": round(tokens_per_s * flops_per_token / p, 4) if p else None, "loss": round(float(loss.detach()), 3),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--eager", action="store_true", help="leave torch.compile out")
    parser.add_argument("--only", nargs="*", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--mode", default=None, help="torch.compile mode")
    args = parser.parse_args()
    global MODE
    MODE = args.mode
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True
    shape = ({"n_layer": 12, "n_head": 12, "n_embd": 768, "block_size": 1024} if args.device == "cuda"
             else {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64})
    for name in args.only:
        try:
            result = measure(torch, args.device, shape, name, args.seconds, not args.eager)
        except Exception as exc:  # noqa: BLE001 - a probe reports and goes on
            result = {"variant": name, "error": repr(exc)[:500]}
        print(json.dumps(result), flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())
