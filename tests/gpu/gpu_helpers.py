"""What the GPU tier's tests share: the models they train, training through the CLI, and reading a run's losses.

Nothing here picks the device: a run on a machine with CUDA trains on cuda:LOCAL_RANK by itself
(toolkit.train.distributed.setup), with NCCL where there is a process group, as a user's run does.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from toolkit.rundir import RunDir

PROJECT = Path(__file__).resolve().parents[2]


def sets(*assignments: str) -> tuple[str, ...]:
    """``sets("a=1", "b=2")`` -> ("--set", "a=1", "--set", "b=2")."""
    return tuple(arg for a in assignments for arg in ("--set", a))


BF16, FP16 = sets("engine.precision=bf16"), sets("engine.precision=fp16")
# The built-in GPT at 4 x 128 (~0.8M parameters), 16 sequences of 128 bytes a step: the plumbing, in seconds.
GPT_4x128 = sets("model.n_layer=4", "model.n_head=4", "model.n_embd=128", "model.block_size=128",
                 "train.batch_size=16", "optim.lr=3e-3", "optim.warmup_steps=5")
# GPT-2 small's shape (12 x 768, 12 heads, 1,024 context; ~85M parameters with a byte vocabulary), 8 sequences a step:
# where a figure (MFU, memory, checkpoint cost) should mean something on a GPU.
GPT2_SMALL = sets("model.n_layer=12", "model.n_head=12", "model.n_embd=768", "model.block_size=1024",
                  "train.batch_size=8", "train.eval_batches=2", "optim.lr=1e-3", "optim.min_lr=1e-4",
                  "optim.warmup_steps=5")
# Evaluate only at the end (always done), on few batches: evaluation is not what these runs test
QUIET = sets("train.eval_every=100000", "train.eval_batches=2")
# The built-in `llama` config (a transformers Llama from its config, 4 x 128) in bf16 for 60 steps: trained once, read
# by the training test and served by the serving tests
LLAMA = ("llama", *sets("train.max_steps=60", "train.log_every=5", "optim.warmup_steps=10"), *QUIET, *BF16)


def cli(*args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m toolkit ARGS`` from the project, as tests/conftest.py's ``cli`` (with an environment option)."""
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=PROJECT, env=env)


def train(run_dir: Path, *args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, RunDir]:
    """``trainbook train ARGS --run-dir RUN_DIR`` (ARGS: the config, then flags)."""
    proc = cli("train", *args, "--run-dir", str(run_dir), env=env)
    return proc, RunDir(run_dir)


def log_tail(run: RunDir, chars: int = 3000) -> str:
    """The end of the run's train.log (every rank's output), for a failure's message."""
    path = run.path / "train.log"
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no train.log)"


def completed(proc: subprocess.CompletedProcess, run: RunDir) -> None:
    assert proc.returncode == 0, f"{proc.stderr[-2000:]}\n--- train.log ---\n{log_tail(run)}"
    assert run.read_status()["state"] == "completed", run.read_status()


def assert_learned(run: RunDir, drop: float) -> list[dict]:
    """Every logged loss finite, and the last at least ``drop`` nats below the first. Returns the train events."""
    train = run.events("train")
    losses = [e["loss"] for e in train]
    assert len(losses) >= 2 and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - drop, f"the loss did not fall by {drop} nats: {losses}"
    return train


def lineage_device(run: RunDir) -> dict:
    """What rank 0 trained on (lineage.json's device: type, name, precision, backend)."""
    return run.read_lineage()["device"]


def peak_memory_mib(run: RunDir) -> list[float]:
    """Each rank's peak memory (MiB) in the run's last train event."""
    return run.events("train")[-1]["peak_memory_mb"]


def n_params(run: RunDir) -> int:
    return next(e["n_params"] for e in run.events("status") if e.get("n_params"))
