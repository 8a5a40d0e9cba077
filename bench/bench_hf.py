"""A Hugging Face model through Trainbook, against Hugging Face's own Trainer and a bare loop of the same model.

    python bench/bench_hf.py [--rounds 5] [--steps 80] [--device cuda] [--set model.hf.config.hidden_size=2048 ...]

The model is the shipped `llama` config (a 4-layer, 128-wide Llama built from its config, bytes as tokens), batch
16 x 128 tokens, the threads each process gets by default. Three sides, each a whole process of its own, run
interleaved, each round starting with the next side (bare, Trainer, Trainbook; Trainer, Trainbook, bare; ...):

  bare       a hand-written loop: sample windows, forward, cross entropy, backward, clip, AdamW step (fused)
  Trainer    transformers.Trainer over a dataset of the same windows (its default fused AdamW, clipping, cosine
             schedule)
  Trainbook  `python -m toolkit train llama` as a user types it: the CLI, its supervisor and the worker

Throughput counts the steps after step WARM (start-up, first-step allocations and thread-pool warm-up left out) on
every side, two ways: tokens / seconds between the end of step WARM and the end of the last step, and the median
over 5-step windows of their tokens/s (this machine has other tenants: a burst slows a window or two, which moves
the mean and hardly the median). Start-up is the
wall time from the command to the moment the training loop begins (Trainbook: the run's `running` event; Trainer:
on_train_begin; bare: its loop's first line). Quoted: the median of the per-round ratios with their range, since
this machine varies by 30% between processes. Targets (issue 15): Trainbook >= 0.97 of bare, and not below Trainer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT))

import figures  # noqa: E402

WARM = 10  # steps left out of throughput: start-up, first-step allocations, thread-pool warm-up
WINDOW = 5  # steps per timing window (Trainbook's log interval in this bench)


def _throughput(ends: list[float], tokens_per_step: int) -> dict:
    """From the end time of every step: tokens/s over all steps after WARM, and the median of the WINDOW-step
    windows' tokens/s (a burst from another tenant of this machine moves the mean, hardly the median)."""
    windows = [WINDOW * tokens_per_step / (ends[i + WINDOW] - ends[i])
               for i in range(WARM - 1, len(ends) - WINDOW, WINDOW)]
    return {"tokens_per_s": (len(ends) - WARM) * tokens_per_step / (ends[-1] - ends[WARM - 1]),
            "window_median": statistics.median(windows)}
CONFIG = "llama"


def _setup(steps: int, settings: list[str], device: str):
    import torch

    from toolkit import config as config_mod
    from toolkit.data.corpus import pydoc_text
    from toolkit.train.models import build_model

    cfg = config_mod.load(CONFIG, [f"train.max_steps={steps}", *settings])
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model).to(device)
    data = torch.frombuffer(bytearray(pydoc_text()), dtype=torch.uint8)
    data = data[: int(len(data) * (1 - cfg.data.val_fraction))]
    return cfg, model, data


def _windows(data, batch: int, block: int, generator):
    import torch

    starts = torch.randint(len(data) - block - 1, (batch,), generator=generator)
    return data[starts[:, None] + torch.arange(block + 1)].long()


def _step_end(device: str) -> float:
    """When a step ended: on a GPU once its kernels have (a synchronisation per step, on every side alike)."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter()


def bare_side(steps: int, started: float, settings: list[str], device: str) -> dict:
    """nanoGPT's loop around the HF model (bf16 autocast on a GPU)."""
    import contextlib

    import torch
    import torch.nn.functional as F

    cfg, model, data = _setup(steps, settings, device)
    o = cfg.optim
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=o.lr, betas=(o.beta1, o.beta2),
                                  fused=True)  # the kernel the torch engine steps with: the ratio is the overhead
    generator = torch.Generator().manual_seed(0)
    B, T = cfg.train.batch_size, cfg.model.block_size
    begin = time.time()
    ends = []
    for step in range(steps):
        chunk = _windows(data, B, T, generator).to(device)
        for group in optimizer.param_groups:
            group["lr"] = o.lr * min(1.0, (step + 1) / max(1, o.warmup_steps))
        with torch.autocast(device, dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext():
            logits = model(input_ids=chunk[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), chunk[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ends.append(_step_end(device))
    return {**_throughput(ends, B * T), "startup_s": begin - started}


def trainer_side(steps: int, started: float, out: str, settings: list[str], device: str) -> dict:
    """transformers.Trainer on the same model, windows, optimizer settings and threads (bf16 on a GPU)."""
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    cfg, model, data = _setup(steps, settings, device)
    B, T = cfg.train.batch_size, cfg.model.block_size

    class Windows(torch.utils.data.Dataset):
        # finite: Trainer shuffles with randperm(len(dataset))
        def __len__(self):
            return steps * B

        def __getitem__(self, i):
            w = _windows(data, 1, T, torch.Generator().manual_seed(i))[0, :-1]
            return {"input_ids": w, "labels": w}  # Trainer's models shift labels themselves

    marks = {}

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            marks["begin"] = time.time()

        def on_step_end(self, args, state, control, **kw):
            marks.setdefault("ends", []).append(_step_end(device))

    o = cfg.optim
    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=B, max_steps=steps, learning_rate=o.lr, weight_decay=o.weight_decay,
        adam_beta1=o.beta1, adam_beta2=o.beta2, max_grad_norm=o.grad_clip, warmup_steps=o.warmup_steps,
        lr_scheduler_type="cosine", logging_steps=cfg.train.log_every, save_strategy="no", report_to=[],
        use_cpu=device == "cpu", bf16=device == "cuda", dataloader_num_workers=0, disable_tqdm=True,
        optim="adamw_torch_fused")  # Trainer's own default (torch >= 2.8), and the torch engine's kernel
    Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[Clock()]).train()
    return {**_throughput(marks["ends"], B * T), "startup_s": marks["begin"] - started}


def trainbook_side(steps: int, run_dir: Path, settings: list[str], device: str) -> dict:
    """`python -m toolkit train llama`, the way a user runs it; figures from the run's events."""
    from toolkit.events import StatusEvent, TrainEvent, read_events
    from toolkit.rundir import RunDir

    settings = [f"train.max_steps={steps}", f"train.eval_every={steps}", "train.eval_batches=1",
                "checkpoint.at_end=false", f"train.log_every={WINDOW}", *settings,
                *(["engine.precision=bf16"] if device == "cuda" else [])]
    started = time.time()
    proc = subprocess.run([sys.executable, "-m", "toolkit", "train", CONFIG, "--run-dir", str(run_dir),
                           *[a for s in settings for a in ("--set", s)]],
                          capture_output=True, text=True, cwd=PROJECT)
    if proc.returncode != 0:
        raise SystemExit(f"trainbook train {CONFIG} failed:\n{proc.stderr[-2000:]}")
    run = RunDir(run_dir)
    cfg = run.read_config()
    train = read_events(run, TrainEvent)
    running = next(e for e in read_events(run, StatusEvent) if e.state == "running")
    first = next(e for e in train if e.step == WARM)
    last = train[-1]
    tokens = (last.step - first.step) * cfg.train.batch_size * cfg.model.block_size
    return {"tokens_per_s": tokens / (last.elapsed_s - first.elapsed_s),
            "window_median": statistics.median(e.tokens_per_s for e in train if e.step > WARM),
            "startup_s": running.time - started}


def _own_process(side: str, steps: int, tmp: Path, settings: list[str], device: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--side", side, "--steps", str(steps), "--started",
                           repr(time.time()), "--out", str(tmp), "--device", device,
                           *[a for s in settings for a in ("--set", s)]], capture_output=True, text=True, cwd=PROJECT)
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.splitlines()[-1])


def _median_range(values) -> str:
    return f"median {statistics.median(values):.3f} (range {min(values):.3f} to {max(values):.3f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="a multiple of 3: each side starts a round as often")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--side", choices=["bare", "trainer"], help="(internal) run one side in this process")
    parser.add_argument("--started", type=float, help="(internal) when the side's command was given")
    parser.add_argument("--out", help="(internal) a scratch folder")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="a change to the llama config, for every side (e.g. a ~1B model's sizes on a GPU)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: bf16 on the first GPU")
    args = parser.parse_args()
    if args.steps < WARM + 2 * WINDOW or args.steps % WINDOW:
        parser.error(f"--steps: {args.steps} is not allowed; allowed: a multiple of {WINDOW}, {WARM + 2 * WINDOW} "
                     "or more (two timing windows after the warm-up)")
    if args.side == "bare":
        print(json.dumps(bare_side(args.steps, args.started, args.settings, args.device)))
        return 0
    if args.side == "trainer":
        print(json.dumps(trainer_side(args.steps, args.started, args.out, args.settings, args.device)))
        return 0

    shape = f"{CONFIG} config: 4 layers x 128, bytes, batch 16 x 128 tokens"
    if args.settings:
        shape = f"{CONFIG} config with {' '.join(args.settings)}"
    print(f"== a Hugging Face Llama ({shape}) on {args.device}, {args.steps} steps per side per round, throughput "
          f"after step {WARM}, whole processes interleaved")
    print(f"  {'round':>5} {'bare tok/s':>11} {'Trainer tok/s':>14} {'Trainbook tok/s':>16} {'TB/bare':>8} "
          f"{'TB/Trainer':>11}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="trainbook-bench-hf-") as tmp:
        for r in range(args.rounds):
            # Each round starts with the next side (bare Trainer Trainbook, Trainer Trainbook bare, ...): a side always
            # run first or last would carry whatever the machine does at that point of a round.
            own = (args.settings, args.device)
            sides = {"bare": lambda: _own_process("bare", args.steps, Path(tmp) / f"bare-{r}", *own),
                     "trainer": lambda: _own_process("trainer", args.steps, Path(tmp) / f"trainer-{r}", *own),
                     "trainbook": lambda: trainbook_side(args.steps, Path(tmp) / f"trainbook-{r}", *own)}
            order = list(sides)[r % 3:] + list(sides)[:r % 3]
            got = {side: sides[side]() for side in order}
            bare, trainer, tb = got["bare"], got["trainer"], got["trainbook"]
            rows.append((bare, trainer, tb))
            print(f"  {r + 1:>5} {bare['tokens_per_s']:>11,.0f} {trainer['tokens_per_s']:>14,.0f} "
                  f"{tb['tokens_per_s']:>16,.0f} {tb['tokens_per_s'] / bare['tokens_per_s']:>8.3f} "
                  f"{tb['tokens_per_s'] / trainer['tokens_per_s']:>11.3f}", flush=True)
    for key, what in (("tokens_per_s", "tokens/s after step WARM"),
                      ("window_median", f"median of {WINDOW}-step windows' tokens/s (robust to bursts)")):
        vs_bare = [tb[key] / bare[key] for bare, _, tb in rows]
        vs_trainer = [tb[key] / trainer[key] for _, trainer, tb in rows]
        trainer_vs_bare = [trainer[key] / bare[key] for bare, trainer, _ in rows]
        print(f"  {what.replace('WARM', str(WARM))}:")
        print(f"    Trainbook / bare:    {_median_range(vs_bare)}; target >= 0.97 -> "
              f"{'PASS' if statistics.median(vs_bare) >= 0.97 else 'FAIL'}")
        print(f"    Trainbook / Trainer: {_median_range(vs_trainer)}; target >= 1.00 -> "
              f"{'PASS' if statistics.median(vs_trainer) >= 1.0 else 'FAIL'}")
        print(f"    Trainer / bare:      {_median_range(trainer_vs_bare)} (for reference)")
        how = "tokens/s after step WARM" if key == "tokens_per_s" else f"median {WINDOW}-step window"
        for name, values, target in (("bare", vs_bare, 0.97), ("trainer", vs_trainer, 1.0)):
            figures.record(__file__, f"{key}_vs_{name}", area="training",
                           figure=f"a Hugging Face Llama on {args.device}, {how.replace('WARM', str(WARM))}",
                           compared=f"Trainbook (the CLI) / {'a bare loop' if name == 'bare' else 'HF Trainer'}",
                           values=values, target=(">=", target))
    print("  command to the training loop's start, seconds (median): "
          + ", ".join(f"{name} {statistics.median(row[i]['startup_s'] for row in rows):.2f}"
                      for i, name in enumerate(("bare", "Trainer", "Trainbook"))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
