"""LoRA against a full fine-tune of the same pretrained Hugging Face model, each run as a user runs it.

    python bench/bench_lora.py [--rounds 3] [--steps 40]

The base is a Llama built from the shipped `llama` config, widened to 384 x 6 layers (~11M parameters, bytes as
tokens) and saved with `save_pretrained`; both sides start from it (`model.init_from`) through
`python -m toolkit train llama` (the CLI, its supervisor and the worker), batch 8 x 128 tokens, a checkpoint every
10 steps (async, the default). Full and LoRA (rank 8 on the attention projections, peft's default targets) run
interleaved, full LoRA full LoRA ..., and each figure is the median over the rounds:

  trainable    parameters the optimizer updates (the run's first status event)
  peak MiB     the worker's peak resident memory (the completed status event; ru_maxrss on a CPU)
  ckpt MiB     the newest checkpoint's size on disk (LoRA checkpoints hold the adapters and their moments only)
  blocking ms  what a checkpoint kept training standing still (median over the run's checkpoints)
  lost ms      its whole cost: blocking plus the slowdown of the steps its background write overlapped
  tokens/s     steady-state training throughput (toolkit.train.metrics.steady_state)

The ratios LoRA / full are per round, quoted as the median with their range (this machine varies by 30% between
processes).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import figures  # noqa: E402

CONFIG = "llama"
WIDER = {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 6,
         "num_key_value_heads": 6}
EVERY = 10  # checkpoint interval, steps
SIDES = {"full": [], "LoRA r=8": ["model.lora.rank=8", "model.lora.alpha=16"]}


def _model_settings() -> list[str]:
    return [f"model.hf.config.{key}={value}" for key, value in WIDER.items()] + ["train.batch_size=8"]


def save_base(folder: Path) -> Path:
    """The pretrained model both sides start from: random weights are enough to measure what training costs."""
    import torch

    from toolkit import config as config_mod
    from toolkit.train.models import build_model

    cfg = config_mod.load(CONFIG, _model_settings())
    torch.manual_seed(0)
    build_model(cfg.model).save_pretrained(folder)
    return folder


def run_side(settings: list[str], base: Path, run_dir: Path, steps: int) -> dict:
    from toolkit.report.tables import fine_tune_rows
    from toolkit.events import CheckpointEvent, read_events
    from toolkit.rundir import RunDir

    flags = [*_model_settings(), f"model.init_from={base}", f"train.max_steps={steps}", f"train.eval_every={steps}",
             "train.eval_batches=1", "train.log_every=5", f"checkpoint.every_steps={EVERY}", "checkpoint.keep_last=2",
             *settings]
    proc = subprocess.run([sys.executable, "-m", "toolkit", "train", CONFIG, "--run-dir", str(run_dir),
                           *[a for s in flags for a in ("--set", s)]], capture_output=True, text=True, cwd=PROJECT)
    if proc.returncode != 0:
        raise SystemExit(f"trainbook train {CONFIG} {' '.join(settings)} failed:\n{proc.stderr[-2000:]}")
    (row,) = fine_tune_rows({"run": run_dir})
    # the first checkpoint also pays for first-time allocations in its window: the steady ones are what an
    # interval costs
    checkpoints = read_events(RunDir(run_dir), CheckpointEvent)[1:]
    row["blocking_ms"] = statistics.median(c.blocking_ms for c in checkpoints)
    row["lost_ms"] = statistics.median(c.lost_ms for c in checkpoints if c.lost_ms is not None)
    return row


COLUMNS = (("trainable", "trainable", "{:,.0f}"), ("peak_memory_mb", "peak MiB", "{:,.0f}"),
           ("checkpoint_mb", "ckpt MiB", "{:,.2f}"), ("blocking_ms", "blocking ms", "{:,.1f}"),
           ("lost_ms", "lost ms", "{:,.1f}"), ("tokens_per_s", "tokens/s", "{:,.0f}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()

    print(f"== LoRA vs full fine-tune: a {WIDER['num_hidden_layers']} x {WIDER['hidden_size']} Llama from pretrained "
          f"weights, batch 8 x 128 tokens, {args.steps} steps, a checkpoint every {EVERY}, interleaved rounds")
    results: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-lora-") as tmp:
        base = save_base(Path(tmp) / "base")
        for r in range(args.rounds):
            for side, settings in SIDES.items():
                results[side].append(run_side(settings, base, Path(tmp) / f"{side.split()[0]}-{r}", args.steps))
            print(f"  round {r + 1}: " + ", ".join(f"{side} {rows[-1]['tokens_per_s']:,.0f} tok/s"
                                                 for side, rows in results.items()), flush=True)
    print(f"  {'side':<10}" + "".join(f"{title:>13}" for _, title, _ in COLUMNS))
    for side, rows in results.items():
        print(f"  {side:<10}" + "".join(f"{fmt.format(statistics.median(r[key] for r in rows)):>13}"
                                        for key, _, fmt in COLUMNS))
    full, lora = results["full"], results["LoRA r=8"]
    print("  LoRA / full, median of the per-round ratios (range):")
    for key, title, _ in COLUMNS:
        ratios = [b[key] / a[key] for a, b in zip(full, lora) if a[key] and b[key] is not None]
        print(f"    {title:<12} {statistics.median(ratios):.3f} ({min(ratios):.3f} to {max(ratios):.3f})")
        figures.record(__file__, key, area="fine-tuning", figure=f"LoRA r=8 against a full fine-tune: {title}",
                       compared=f"LoRA / full, a {WIDER['num_hidden_layers']} x {WIDER['hidden_size']} Llama",
                       values=ratios)
    return 0


if __name__ == "__main__":
    sys.exit(main())
