"""train.compile on this machine: compiled against eager training, through the path a user runs.

    python bench/bench_compile.py [--rounds 3] [--steps 80]

The demo config's layout at 6 x 256 (4.8M parameters; the width bench_accumulation uses), `python -m toolkit train
demo` with train.compile false and true, interleaved A B A B over several rounds. Per run:
  - steady tokens/s: the median of its train events' tokens/s, the first log window (which holds the first step's
    compile) left out, so the figure is what the run settles at;
  - compile seconds: the run's compile events summed (forward and backward graphs, evaluation's too); the first
    run's compile is cold, the later ones read Inductor's on-disk cache;
  - whole-run tokens/s: tokens over the run's training time, compile included (what a short run gets).
The ratios compiled / eager: median and range over the rounds; and the steps after which compiling has paid for
itself (compile seconds / time saved per step), where it is faster at all.
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
from toolkit.events import CompileEvent, StatusEvent, TrainEvent, read_events  # noqa: E402

SIDES = {"eager": ["train.compile=false"], "compiled": ["train.compile=true"]}
MODEL = ["model.n_layer=6", "model.n_embd=256", "model.n_head=8"]
QUIET = ["train.max_seconds=0", "profile.enabled=false", "train.eval_batches=1", "checkpoint.at_end=false",
         "train.log_every=10"]


def cli_run(run_dir: Path, steps: int, settings: list[str]) -> dict:
    run = cli_train.train("demo", run_dir, [f"train.max_steps={steps}", f"train.eval_every={steps}", *QUIET, *MODEL,
                                            *settings])
    cfg = run.read_config()
    final = read_events(run, StatusEvent)[-1]
    tokens = steps * cfg.train.batch_size * cfg.train.grad_accum_steps * cfg.model.block_size
    windows = [e.tokens_per_s for e in read_events(run, TrainEvent)][1:]
    return {"steady": statistics.median(windows), "whole": tokens / final.train_seconds,
            "compile_s": sum(e.seconds for e in read_events(run, CompileEvent)),
            "tokens_per_step": tokens / steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80, help="optimizer steps per run")
    args = parser.parse_args()

    print(f"== train.compile: compiled vs eager, demo layout at 6 x 256 (4.8M parameters), {args.steps} steps per "
          f"run, through the CLI, interleaved")
    print(f"  {'round':>5} {'eager tok/s':>12} {'compiled':>12} {'ratio':>7} {'compile s':>10} {'whole ratio':>12}")
    steady, whole, compile_s, saved = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-compile-") as tmp:
        for r in range(args.rounds):
            order = list(SIDES) if r % 2 == 0 else list(SIDES)[::-1]
            got = {side: cli_run(Path(tmp) / f"{r}-{side}", args.steps, SIDES[side]) for side in order}
            eager, compiled = got["eager"], got["compiled"]
            steady.append(compiled["steady"] / eager["steady"])
            whole.append(compiled["whole"] / eager["whole"])
            compile_s.append(compiled["compile_s"])
            per_step = eager["tokens_per_step"]
            saved.append(per_step / eager["steady"] - per_step / compiled["steady"])  # seconds a step, + if faster
            print(f"  {r + 1:>5} {eager['steady']:>12,.0f} {compiled['steady']:>12,.0f} {steady[-1]:>7.3f} "
                  f"{compile_s[-1]:>10.1f} {whole[-1]:>12.3f}", flush=True)
    med = statistics.median(steady)
    print(f"  steady tokens/s, compiled / eager: median {med:.3f} (range {min(steady):.3f} to {max(steady):.3f})")
    print(f"  whole run ({args.steps} steps, compile included): median {statistics.median(whole):.3f} (range "
          f"{min(whole):.3f} to {max(whole):.3f})")
    print(f"  compile: {compile_s[0]:.1f} s in the first run, {statistics.median(compile_s[1:] or compile_s):.1f} s "
          f"once Inductor's cache holds the graphs (a cold cache is what a new machine or a new model pays)")
    figures.record(__file__, "steady", area="training", figure="train.compile, steady tokens/s",
                   compared="compiled / eager, demo layout at 6 x 256, through the CLI", values=steady)
    figures.record(__file__, "whole_run", area="training", figure="train.compile, whole-run tokens/s",
                   compared=f"compiled / eager over {args.steps} steps, compile included", values=whole)
    gain = statistics.median(saved)
    if min(steady) <= 1.0 <= max(steady):
        print("  no measurable gain: the rounds' ratios straddle 1.0 (train.compile stays off by default here)")
    elif gain > 0:
        print(f"  compiling pays for itself after about {statistics.median(compile_s) / gain:,.0f} steps")
    else:
        print("  compiled steps are not faster here: compiling never pays for itself on this machine "
              "(train.compile stays off by default)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
