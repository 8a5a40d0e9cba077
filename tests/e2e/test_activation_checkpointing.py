"""Activation checkpointing (model.activation_checkpointing) in real runs through the CLI: every block recomputed in
backward (counted in the profiler's trace) and the same losses as without it, on the torch engine, DeepSpeed ZeRO-3
over 2 processes and a Hugging Face Llama under DDP; an exact resume after SIGKILL; a user's module that cannot
checkpoint refused before any run directory exists. (Gradients compared tensor by tensor, LoRA and dropout included:
tests/unit/test_activation_checkpointing.py.)"""

from __future__ import annotations

import json

import pytest

from toolkit.rundir import RunDir

from conftest import BIGRAM_MODEL, cli
from test_checkpoint import CKPT, DEEPSPEED_ZERO3_2, EVERY, STEPS, TORCH_1, assert_log_matches, losses_by_step
from test_user_models import HF

pytestmark = pytest.mark.slow

AC = ("--set", "model.activation_checkpointing=true")
HF_DDP_2 = ("--nproc", "2")  # as test_user_models' torch-ddp-2: the HF reference without it is shared, trained once a session
# rank 0 traces 2 steps: the trace shows each block's attention run twice a step, once more in backward's recompute
PROFILE = ("--set", "profile.enabled=true", "--set", "profile.wait=1", "--set", "profile.warmup=1",
           "--set", "profile.active=2")


def attention_calls(run: RunDir) -> int:
    """How many times attention ran forward (recomputes included) in the profiled steps of rank 0."""
    (trace,) = run.profile_dir.glob("rank0*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    return sum(e.get("ph") == "X" and e.get("name") == "aten::scaled_dot_product_attention" for e in events)


def assert_recomputed(run: RunDir) -> None:
    """Each layer's attention ran twice per profiled step: the forward, and its recompute in backward."""
    cfg = run.read_config()
    layers = cfg.model.hf.config["num_hidden_layers"] if cfg.model.name == "hf" else cfg.model.n_layer
    assert attention_calls(run) == 2 * layers * cfg.profile.active * cfg.train.grad_accum_steps


def assert_same_losses(checkpointed: RunDir, reference: RunDir) -> None:
    """Every step's training loss and the final validation loss agree (recomputing runs the same kernels on the same
    inputs, so on one machine they are in fact bit for bit the same)."""
    assert checkpointed.read_config().model.activation_checkpointing
    assert not reference.read_config().model.activation_checkpointing
    got, want = losses_by_step(checkpointed), losses_by_step(reference)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    assert [got[s] for s in sorted(got)] == pytest.approx([want[s] for s in sorted(want)], rel=1e-5)
    assert checkpointed.events("eval")[-1]["val_loss"] == pytest.approx(reference.events("eval")[-1]["val_loss"],
                                                                        rel=1e-5)


@pytest.mark.parametrize("flags", [pytest.param(TORCH_1, id="torch-1"),
                                   pytest.param(DEEPSPEED_ZERO3_2, id="deepspeed-zero3-2", marks=pytest.mark.matrix),
                                   pytest.param((*HF, *HF_DDP_2), id="hf-llama-torch-ddp-2",
                                                marks=pytest.mark.matrix)])
def test_losses_with_activation_checkpointing_equal_those_without(finished_runs, flags):
    checkpointed = finished_runs(*CKPT, *flags, *AC, *PROFILE)  # the profiler changes no loss
    assert_recomputed(checkpointed)
    assert_same_losses(checkpointed, finished_runs(*CKPT, *flags))


def test_a_killed_run_with_activation_checkpointing_resumes_exactly(tmp_path, finished_runs, rng):
    kill_at = rng.randint(EVERY + 1, STEPS - 1)  # a random step, past the first checkpoint
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *CKPT, *AC,
               "--set", f"fault.kill_at_step={kill_at}", "--max-restarts", "1")
    assert proc.returncode == 0, f"kill at {kill_at}: {proc.stderr[-3000:]}"
    run = RunDir(tmp_path / "r")
    assert len(run.events("restart")) == 1 and run.read_status()["state"] == "completed"
    assert_log_matches(run, finished_runs(*CKPT, *AC, *PROFILE))  # the uninterrupted run of the test above


def test_a_users_module_that_cannot_checkpoint_is_refused_before_launch(tmp_path):
    (tmp_path / "bigram.py").write_text(BIGRAM_MODEL)  # no gradient_checkpointing_enable
    factory = f"{tmp_path / 'bigram.py'}:build"
    proc = cli("train", "tiny", "--runs-root", str(tmp_path / "runs"), "--set", "model.name=custom",
               "--set", f"model.factory={factory}", *AC)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == (f"error: model.activation_checkpointing: True needs the module to have "
                           f"gradient_checkpointing_enable(), and Bigram from {factory} has none; allowed: false, or a "
                           f"module with a gradient_checkpointing_enable() method (as transformers models have)\n")
    assert not (tmp_path / "runs").exists()
