"""FSDP2 against DeepSpeed ZeRO-3 and ZeRO-2 at 2 processes: what PyTorch's own sharding trains at, tokens/s.

    python bench/bench_fsdp.py [--rounds 3] [--steps 30] [--config tiny] [--set section.field=value ...]

`python -m toolkit train CONFIG --nproc 2` with engine.name=fsdp, and with engine.name=deepspeed at
engine.zero_stage 3 and 2, interleaved (the order rotates each round), through the CLI, on a GPT of about 20M
parameters (MODEL). FSDP2 and ZeRO-3 shard the same things (parameters, gradients, optimizer state); ZeRO-2 keeps
whole parameters, so it gathers nothing. Per run: the median of its train events' tokens/s, the first log window
(start-up) left out. Quoted: FSDP2 / ZeRO-3 (issue 56's target: at least 1.0) and FSDP2 / ZeRO-2, median and range.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import cli_train  # noqa: E402
import figures  # noqa: E402
from bench_zero import QUIET, steady_tokens_per_s  # noqa: E402

# 6 blocks of width 512: 12 x 512^2 x 6 = 18.9M in the blocks, 20.5M with the embeddings
MODEL = ["model.n_embd=512", "model.n_layer=6", "model.n_head=8"]
ENGINES = {
    "fsdp": ["engine.name=fsdp"],
    "zero3": ["engine.name=deepspeed", "engine.zero_stage=3"],
    "zero2": ["engine.name=deepspeed", "engine.zero_stage=2"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = parser.parse_args()
    if args.steps < 15:
        parser.error(f"--steps: {args.steps} is not allowed; allowed: 15 or more (two log windows after the first)")
    import torch

    precision = ["engine.precision=bf16"] if torch.cuda.is_available() else []
    shown = " ".join(MODEL + precision + args.settings)
    print(f"== FSDP2 vs ZeRO-3 and ZeRO-2, 2 processes, `train {args.config}` {shown}, {args.steps} steps a run, "
          "interleaved")
    print(f"  {'round':>5} {'FSDP2 tok/s':>12} {'ZeRO-3 tok/s':>13} {'ZeRO-2 tok/s':>13} {'/ZeRO-3':>8} {'/ZeRO-2':>8}")
    vs3, vs2 = [], []
    names = list(ENGINES)
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-fsdp-") as tmp:
        for r in range(args.rounds):
            got = {}
            for name in names[r % len(names):] + names[: r % len(names)]:
                run = cli_train.train(args.config, Path(tmp) / f"{r}-{name}", [
                    *ENGINES[name], "engine.nproc=2", f"train.max_steps={args.steps}",
                    f"train.eval_every={args.steps}", *MODEL, *QUIET, *precision, *args.settings])
                got[name] = steady_tokens_per_s(run)
            vs3.append(got["fsdp"] / got["zero3"])
            vs2.append(got["fsdp"] / got["zero2"])
            print(f"  {r + 1:>5} {got['fsdp']:>12,.0f} {got['zero3']:>13,.0f} {got['zero2']:>13,.0f} "
                  f"{vs3[-1]:>8.3f} {vs2[-1]:>8.3f}", flush=True)
    for label, ratios in (("ZeRO-3", vs3), ("ZeRO-2", vs2)):
        print(f"  FSDP2 / {label}: median {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f} to {max(ratios):.3f})")
    print(f"  target FSDP2 / ZeRO-3 >= 1.0 -> {'PASS' if statistics.median(vs3) >= 1.0 else 'FAIL'}")
    figures.record(__file__, "fsdp_vs_zero3", area="scaling", figure=f"FSDP2 at 2 processes, {args.config} ~20M",
                   compared="tokens/s, FSDP2 / DeepSpeed ZeRO-3, through the CLI", values=vs3, target=(">=", 1.0))
    figures.record(__file__, "fsdp_vs_zero2", area="scaling", figure=f"FSDP2 at 2 processes, {args.config} ~20M",
                   compared="tokens/s, FSDP2 / DeepSpeed ZeRO-2, through the CLI", values=vs2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
