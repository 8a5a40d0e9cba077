"""Activation checkpointing (model.activation_checkpointing): the memory a training step takes, and its time, with
and without it.

    python bench/bench_activation_checkpointing.py [--rounds 3] [--steps 5]

Two models big enough that activations matter and small enough that a step takes about a second on 2 CPU cores,
each built the way a run builds it (toolkit.train.models.prepare_model) and trained by the torch engine's own step
(TorchEngine.train_step: forward, backward, clipping, AdamW) on batches of the built-in pydoc corpus:

  gpt        the built-in GPT, 8 layers x 256 wide, 8 heads, context 256, batch 4
  llama      the shipped `llama` config (a Hugging Face Llama from its config) widened to 8 layers x 256, context
             256, batch 4

Each side (off, on) runs in a fresh process of its own, so that nothing one side allocated is still held when the
other is measured. In it: the model is built, one warm-up step allocates AdamW's moments, then

  step time    the median of the timed steps, with glibc's allocator as it is (it keeps freed blocks for reuse);
  memory       what a training step adds to the resident memory: the peak (VmHWM) during MEMORY_STEPS more steps
               minus the resident memory just before them, after the peak was reset (5 to /proc/self/clear_refs).

Not ru_maxrss alone: on a CPU the peak resident memory of the process is mostly the Python, torch and transformers
baseline, the same on both sides, which hides the difference. And before the memory steps the allocator is told to
hand every block of 256 KiB or more straight back to the system when it is freed (mallopt M_MMAP_THRESHOLD, which
also stops glibc raising that threshold as it goes) and to return what it holds (malloc_trim): otherwise freed
activations would stay resident and count as the baseline. So the figure is the activations kept for backward, the
gradients and the step's temporaries. (Left out of the timed steps: mapping fresh pages for every large tensor costs
time.)

The sides run interleaved, off on / on off / ..., and the ratios (on / off) are per round, quoted as the median with
their range: this machine has other tenants, so single figures vary by tens of percent.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import figures  # noqa: E402

MODELS = {
    "gpt": ("tiny", ["model.n_layer=8", "model.n_embd=256", "model.n_head=8", "model.block_size=256",
                     "train.batch_size=4"]),
    "llama": ("llama", ["model.hf.config.hidden_size=256", "model.hf.config.intermediate_size=688",
                        "model.hf.config.num_hidden_layers=8", "model.hf.config.num_attention_heads=8",
                        "model.hf.config.num_key_value_heads=8", "model.hf.config.max_position_embeddings=256",
                        "model.block_size=256", "train.batch_size=4"]),
}
MMAP_THRESHOLD = 256 << 10  # bytes: from the memory steps on, blocks this large are mmapped, and unmapped when freed
MEMORY_STEPS = 2


def _kib(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.M).group(1))


def _return_freed_memory() -> bool:
    """Make freed memory leave the resident set from now on (glibc only); False where the allocator is another."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        m_mmap_threshold = -3  # malloc.h
        return bool(libc.mallopt(m_mmap_threshold, MMAP_THRESHOLD)) and libc.malloc_trim(0) >= 0
    except (OSError, AttributeError):
        return False


def _reset_peak() -> bool:
    """Reset the process's resident high-water mark (Linux >= 4.0); False where it cannot be."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return _kib("VmHWM") <= _kib("VmRSS") + 1024


def side(model: str, on: bool, steps: int) -> dict:
    """One side in this process: its median step time, and the MiB a step adds to the resident memory."""
    import torch

    from toolkit import config as config_mod
    from toolkit.data.corpus import load_corpus
    from toolkit.train.distributed import Topology
    from toolkit.train.engines.torch_engine import TorchEngine
    from toolkit.train.models import loss_function, prepare_model
    from toolkit.train.trainer import train_step

    name, settings = MODELS[model]
    cfg = config_mod.load(name, [*settings, f"model.activation_checkpointing={str(on).lower()}"])
    built, _ = prepare_model(cfg)
    engine = TorchEngine(built, cfg, Topology(0, 0, 1, torch.device("cpu")), loss_function(cfg.model))
    engine.train()
    corpus = load_corpus(cfg)
    generator = torch.Generator().manual_seed(0)
    batches = [corpus.batch("train", cfg.train.batch_size, generator) for _ in range(1 + steps + MEMORY_STEPS)]
    train_step(engine, [batches[0]])  # AdamW's moments now exist; the gradients are freed again
    times = []
    for batch in batches[1:1 + steps]:
        t0 = time.perf_counter()
        train_step(engine, [batch]).item()
        times.append(time.perf_counter() - t0)
    returned = _return_freed_memory()
    before_mib = _kib("VmRSS") / 1024
    reset = _reset_peak()
    for batch in batches[1 + steps:]:
        train_step(engine, [batch]).item()
    peak_mib = _kib("VmHWM") / 1024 if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"step_s": statistics.median(times), "added_mib": peak_mib - before_mib, "baseline_mib": before_mib,
            "params_m": sum(p.numel() for p in built.parameters()) / 1e6, "exact": reset and returned,
            "tokens": cfg.train.batch_size * cfg.model.block_size}


def _own_process(model: str, on: bool, steps: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--side", model, "--on", str(int(on)), "--steps", str(steps)],
                          capture_output=True, text=True, cwd=PROJECT)
    if proc.returncode != 0:
        raise SystemExit(f"{model} activation_checkpointing={on} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def _median_range(values) -> str:
    return f"median {statistics.median(values):.3f} (range {min(values):.3f} to {max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed training steps per side per round")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--side", choices=list(MODELS), help="(internal) run one side in this process")
    parser.add_argument("--on", type=int, choices=[0, 1], help="(internal) activation checkpointing on that side")
    args = parser.parse_args()
    if args.side:
        print(json.dumps(side(args.side, bool(args.on), args.steps)))
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        parser.error(f"--models: {args.models!r} is not allowed; allowed: a comma-separated list of {', '.join(MODELS)}")

    print(f"== activation checkpointing off vs on: {args.steps} timed steps per side per round, each side a fresh "
          f"process, sides interleaved; 'added' = peak resident MiB during the steps - resident MiB before them")
    summary = []
    for model in models:
        name, settings = MODELS[model]
        print(f"\n  {model} ({name} config, {', '.join(s.split('.')[-1] for s in settings)})")
        print(f"  {'round':>5} {'off added MiB':>14} {'on added MiB':>13} {'off step s':>11} {'on step s':>10} "
              f"{'mem on/off':>11} {'time on/off':>12}")
        rows = []
        for r in range(args.rounds):
            # each round starts with the other side: neither always runs first, on a machine that drifts
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {on: _own_process(model, on, args.steps) for on in order}
            off, on = got[False], got[True]
            rows.append((off, on))
            print(f"  {r + 1:>5} {off['added_mib']:>14,.0f} {on['added_mib']:>13,.0f} {off['step_s']:>11.3f} "
                  f"{on['step_s']:>10.3f} {on['added_mib'] / off['added_mib']:>11.3f} "
                  f"{on['step_s'] / off['step_s']:>12.3f}", flush=True)
        first = rows[0][0]
        print(f"  {first['params_m']:.1f}M parameters, {first['tokens']:,} tokens a step; resident before the steps "
              f"~{statistics.median(o['baseline_mib'] for o, _ in rows):,.0f} MiB (Python, torch, the model, AdamW)"
              + ("" if all(s["exact"] for row in rows for s in row) else
                 "; NOTE: this system could not reset the peak or return freed memory: 'added' is approximate"))
        memory = [on["added_mib"] / off["added_mib"] for off, on in rows]
        step = [on["step_s"] / off["step_s"] for off, on in rows]
        summary.append((model, memory, step))
    print("\n  on / off, median of the per-round ratios (range):")
    for model, memory, step in summary:
        print(f"    {model:<6} memory added by a step {_median_range(memory)}; step time {_median_range(step)}")
        for key, what, values in (("memory", "memory a training step adds", memory), ("step_time", "step time", step)):
            figures.record(__file__, f"{model}_{key}", area="memory", figure=f"activation checkpointing, {what}",
                           compared=f"on / off, {model} ({MODELS[model][0]} config), each side a fresh process",
                           values=values)
    return 0


if __name__ == "__main__":
    sys.exit(main())
