"""Packing short conversations: assistant tokens trained per second, packed rows against one conversation a row.

    python bench/bench_packing.py [--rounds 3] [--steps 30]

A file of short chats (one or two exchanges, about 80 to 260 bytes rendered with ChatML), the built-in GPT at 4 x 128
with rows of 512 bytes, 8 rows a step, through the path a user runs (`python -m toolkit train tiny`), the two sides
interleaved A B A B over the rounds. What a step teaches is its assistant tokens (labels that count), so the figure
is those per second of training time: each side's batches are drawn again here from the same config (a batch is a
pure function of the seed and the step) and their counted labels summed. Reported: the median of the per-round
ratios packed / one a row and their range, and the tokens/s of each side (the same rows of 512 either way).
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

MODEL = ["model.n_layer=4", "model.n_embd=128", "model.n_head=4", "model.block_size=512", "train.batch_size=8"]
QUIET = ["profile.enabled=false", "train.eval_batches=1", "checkpoint.at_end=false", "train.log_every=10",
         "data.chat=messages"]
SIDES = {"one a row": ["data.pack=false"], "packed": ["data.pack=true"]}


def write_chats(path: Path, count: int = 2000) -> None:
    rng = random.Random(0)
    words = "the a model step loss data batch token rank GPU cache learning rate checkpoint".split()
    with path.open("w") as f:
        for _ in range(count):
            messages = []
            for _ in range(rng.randint(1, 2)):
                messages.append({"role": "user", "content": " ".join(rng.choices(words, k=rng.randint(2, 6))) + "?"})
                messages.append({"role": "assistant", "content": " ".join(rng.choices(words, k=rng.randint(2, 8)))})
            f.write(json.dumps({"messages": messages}) + "\n")


def counted_tokens(settings: list[str], steps: int) -> int:
    """Assistant tokens (labels that count) in the training batches of steps 0 .. steps - 1 of rank 0."""
    from toolkit import config as config_mod
    from toolkit.data.corpus import StepBatches, load_corpus

    cfg = config_mod.load("tiny", settings)
    batches = StepBatches(load_corpus(cfg), cfg.train.batch_size * cfg.train.grad_accum_steps, cfg.train.seed, 0)
    return sum(int((batches[step]["labels"] != -100).sum()) for step in range(steps))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-packing-") as tmp:
        chats = Path(tmp) / "chats.jsonl"
        write_chats(chats)
        base = [*MODEL, *QUIET, f"data.path={chats}", f"train.max_steps={args.steps}",
                f"train.eval_every={args.steps}"]
        counted = {side: counted_tokens(base + extra, args.steps) for side, extra in SIDES.items()}
        print(f"== packing short chats: GPT 4 x 128, rows of 512 bytes, 8 a step, {args.steps} steps, through the "
              f"CLI, interleaved\n  assistant tokens in {args.steps} steps: "
              + ", ".join(f"{side} {n:,}" for side, n in counted.items()))
        print(f"  {'round':>5} {'one a row':>14} {'packed':>14} {'ratio':>7}   (assistant tokens/s)")
        ratios, rates = [], {side: [] for side in SIDES}
        for r in range(args.rounds):
            order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
            for side in order:
                run = cli_train.train("tiny", Path(tmp) / f"{r}-{side.replace(' ', '-')}", base + SIDES[side])
                seconds = read_events(run, StatusEvent)[-1].train_seconds
                rates[side].append(counted[side] / seconds)
            ratios.append(rates["packed"][-1] / rates["one a row"][-1])
            print(f"  {r + 1:>5} {rates['one a row'][-1]:>14,.0f} {rates['packed'][-1]:>14,.0f} {ratios[-1]:>7.2f}")
        print(f"  packed / one a row: median {statistics.median(ratios):.2f}x (range {min(ratios):.2f} to "
              f"{max(ratios):.2f})")
        figures.record(__file__, "short_chats", area="fine-tuning", figure="packing short conversations",
                       compared="assistant tokens trained per second, packed rows / one conversation a row, GPT "
                       "4 x 128, rows of 512 bytes, through the CLI", values=ratios)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
