"""Preference tuning: a DPO step's time against a supervised fine-tuning (SFT) step's, on the same prompts.

    python bench/bench_dpo.py [--rounds 3] [--steps 30]

One file of preference pairs ({"prompt", "chosen", "rejected"}); SFT reads it as instruction pairs (data.prompt_field
=prompt, data.completion_field=chosen), DPO as pairs (train.objective=dpo). The built-in GPT at 4 x 128 with LoRA
(rank 8, so the reference is the model with its adapters off), rows of 128 bytes, 8 prompts a step, through the path
a user runs (`python -m toolkit train tiny`), the two sides interleaved A B A B over the rounds.

A DPO step does more work than an SFT step of as many prompts: two rows a prompt (chosen and rejected) through the
policy's forward and backward, and the same two rows through the reference's forward. Per weight and row, with LoRA
(the frozen base takes no weight gradients), a forward is about 2 FLOPs and a backward about 2 more, so a DPO step is
about (2 x 4 + 2 x 2) / 4 = 3 times an SFT step. Reported: the median of the per-round ratios of seconds per step
DPO / SFT and their range, against that arithmetic.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import cli_train  # noqa: E402
import figures  # noqa: E402
from toolkit.events import StatusEvent, read_events  # noqa: E402

MODEL = ["model.n_layer=4", "model.n_embd=128", "model.n_head=4", "model.block_size=128", "train.batch_size=8",
         "model.lora.rank=8", 'model.lora.target_modules=["qkv","proj"]']
QUIET = ["profile.enabled=false", "train.eval_batches=1", "checkpoint.at_end=false", "train.log_every=10"]
SIDES = {"SFT": ["data.prompt_field=prompt", "data.completion_field=chosen"], "DPO": ["train.objective=dpo"]}
FLOPS_RATIO = (2 * 4 + 2 * 2) / 4  # policy forward + backward on two rows, reference forward on two / one row's


def write_pairs(path: Path, count: int = 2000) -> None:
    rng = random.Random(0)
    words = "the a model step loss data batch token rank GPU cache learning rate checkpoint".split()
    with path.open("w") as f:
        for _ in range(count):
            prompt = " ".join(rng.choices(words, k=rng.randint(3, 8))) + "?"
            chosen, rejected = (" ".join(rng.choices(words, k=rng.randint(4, 12))) + "." for _ in range(2))
            f.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-dpo-") as tmp:
        pairs = Path(tmp) / "pairs.jsonl"
        write_pairs(pairs)
        base = [*MODEL, *QUIET, f"data.path={pairs}", f"train.max_steps={args.steps}", f"train.eval_every={args.steps}"]
        print(f"== a DPO step against an SFT step of as many prompts: GPT 4 x 128 with LoRA rank 8, rows of 128 bytes, "
              f"8 prompts a step, {args.steps} steps, through the CLI, interleaved")
        print(f"  {'round':>5} {'SFT ms/step':>12} {'DPO ms/step':>12} {'ratio':>7}")
        ratios, step_ms = [], {side: [] for side in SIDES}
        for r in range(args.rounds):
            order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
            for side in order:
                run = cli_train.train("tiny", Path(tmp) / f"{r}-{side}", base + SIDES[side])
                status = read_events(run, StatusEvent)[-1]
                step_ms[side].append(1e3 * status.train_seconds / status.step)
            ratios.append(step_ms["DPO"][-1] / step_ms["SFT"][-1])
            print(f"  {r + 1:>5} {step_ms['SFT'][-1]:>12.1f} {step_ms['DPO'][-1]:>12.1f} {ratios[-1]:>7.2f}")
        print(f"  DPO / SFT seconds per step: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f} to "
              f"{max(ratios):.2f}); the FLOPs arithmetic says {FLOPS_RATIO:.1f}x")
        figures.record(__file__, "dpo_step", area="fine-tuning", figure="a DPO step against an SFT step",
                       compared="seconds per step, DPO / SFT on the same 8 prompts a step, GPT 4 x 128 with LoRA "
                       f"rank 8, through the CLI (FLOPs arithmetic: {FLOPS_RATIO:.1f}x)", values=ratios)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
