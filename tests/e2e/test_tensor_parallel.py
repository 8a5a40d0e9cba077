"""Tensor parallelism (engine.tensor_parallel) through the CLI on 2 and 4 gloo processes: the split model trains as
the unsplit one does, step for step, for the built-in GPT and a transformers Llama; its checkpoints hold whole
tensors, so a run saved at 2 resumes at 1; a change of layout that would change the data-parallel replicas is
refused before anything is written. The exact resume at the same layout is in test_checkpoint's GOLDEN table."""

from __future__ import annotations

import json

import pytest

from conftest import cli
from test_checkpoint import (CKPT, STEPS, TORCH_1, TORCH_DDP_2, TORCH_TP_2, losses_by_step,  # noqa: F401
                             reference_runs)
from test_scaling import scale  # a series borrows every core, as test_scaling's do
from toolkit.resources import zero_stages
from toolkit.rundir import RunDir

pytestmark = pytest.mark.slow

# The split changes the order of a few float sums (a row-parallel matmul adds its halves after an all-reduce), so
# losses agree to about 1e-6 on this model, not bit for bit; 1e-4 leaves room and still fails on any real mistake
# (a wrong slice or an unaveraged gradient moves the loss by 1e-2 within a few steps).
TOLERANCE = 1e-4


def assert_same_losses(got: RunDir, want: RunDir, steps=range(1, STEPS + 1)) -> None:
    a, b = losses_by_step(got), losses_by_step(want)
    assert sorted(a) == sorted(b) == list(steps), (sorted(a), sorted(b))
    worst = max(steps, key=lambda s: abs(a[s] - b[s]))
    assert abs(a[worst] - b[worst]) < TOLERANCE, f"step {worst}: split {a[worst]}, unsplit {b[worst]}"


def lineage(run: RunDir) -> dict:
    return json.loads(run.lineage_path.read_text())


def n_params(run: RunDir) -> int:
    return next(e["n_params"] for e in run.events("status") if e.get("n_params"))


def test_gpt_split_over_two_ranks_trains_as_one_process_does(reference_runs):
    split, whole = reference_runs(TORCH_TP_2), reference_runs(TORCH_1)
    assert_same_losses(split, whole)
    evals = {e["step"]: e["val_loss"] for e in split.events("eval")}
    assert evals.keys() == {e["step"] for e in whole.events("eval")}
    assert all(abs(evals[e["step"]] - e["val_loss"]) < TOLERANCE for e in whole.events("eval"))
    # one replica of two ranks, each holding half of every block matrix and of the (tied) embedding
    parallel, total = lineage(split)["parallel"], n_params(split)
    assert (parallel["processes"], parallel["tensor_parallel"], parallel["data_parallel"]) == (2, 2, 1)
    assert total / 2 < parallel["parameters_per_rank"] < 0.6 * total, (parallel, total)
    assert parallel["parameters_per_rank"] == zero_stages.params_per_rank(split.read_config())  # as predicted
    assert lineage(whole)["parallel"]["parameters_per_rank"] == total
    # the split run drew the batches of one replica: the tokens a step takes are one process's, not two
    assert split.events("train")[0]["tokens_per_s"] > 0 and split.read_status()["step"] == STEPS


def test_saved_split_resumes_unsplit_and_goes_on_as_the_unsplit_run(reference_runs, finished_run_copy):
    run = finished_run_copy(*CKPT, *TORCH_TP_2)
    proc = cli("resume", str(run.path), "--from", "step_00000020", "--set", "engine.nproc=1",
               "--set", "engine.tensor_parallel=1")
    assert proc.returncode == 0, proc.stderr
    assert "resuming from step_00000020" in proc.stderr
    cfg = run.read_config()
    assert (cfg.engine.nproc, cfg.engine.tensor_parallel) == (1, 1)
    assert_same_losses(run, reference_runs(TORCH_1))
    assert lineage(run)["parallel"]["tensor_parallel"] == 1


def test_a_layout_change_that_changes_the_replicas_is_refused_with_nothing_written(finished_run_copy):
    run = finished_run_copy(*CKPT, *TORCH_TP_2)
    before = run.config_path.read_bytes()
    proc = cli("resume", str(run.path), "--from", "step_00000020", "--set", "engine.tensor_parallel=1")
    assert proc.returncode != 0
    assert "2 data-parallel replicas where it had 1" in proc.stderr, proc.stderr
    odd = cli("resume", str(run.path), "--set", "engine.nproc=3", "--set", "train.max_steps=50")
    assert odd.returncode == 2 and "engine.tensor_parallel: 2 does not divide the run's 3 processes" in odd.stderr
    fixed = cli("resume", str(run.path), "--set", "model.n_embd=64")
    assert fixed.returncode == 2, fixed.stderr
    assert "--set: 'model.n_embd=64' changes what a step computes" in fixed.stderr, fixed.stderr
    assert run.config_path.read_bytes() == before


def test_split_replicas_average_their_gradients_as_ddp_does(reference_runs, finished_runs):
    # 4 processes: 2 replicas of 2 ranks against plain DDP over 2 processes, the same batches per replica; with
    # activation checkpointing too (each block recomputed in backward, its all-reduces with it), which changes no loss
    split = finished_runs(*CKPT, "--nproc", "4", "--set", "engine.tensor_parallel=2", "--set",
                          "model.activation_checkpointing=true")
    assert lineage(split)["parallel"]["data_parallel"] == 2
    assert_same_losses(split, reference_runs(TORCH_DDP_2))


def test_a_transformers_llama_splits_by_its_own_plan(tmp_path):
    # the architecture's declared plan (config.base_model_tp_plan): q, k, v, gate and up column-parallel, o and down
    # row-parallel; the embedding split by vocabulary rows; the logits gathered, as the class says (lm_head)
    runs = {}
    for tp in (1, 2):
        run_dir = tmp_path / f"tp{tp}"
        proc = cli("train", "llama", "--run-dir", str(run_dir), "--nproc", str(tp), "--set",
                   f"engine.tensor_parallel={tp}", "--set", "train.max_steps=8", "--set", "train.log_every=1",
                   "--set", "train.eval_every=8")
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[tp] = RunDir(run_dir)
    assert_same_losses(runs[2], runs[1], steps=range(1, 9))
    total, held = n_params(runs[2]), lineage(runs[2])["parallel"]["parameters_per_rank"]
    assert total / 2 < held < 0.6 * total and held == zero_stages.params_per_rank(runs[2].read_config())


def test_a_transformers_model_the_split_does_not_divide_is_refused_before_a_run_exists(tmp_path):
    proc = cli("train", "llama", "--run-dir", str(tmp_path / "r"), "--nproc", "2", "--set", "engine.tensor_parallel=2",
               "--set", 'model.hf.config={"num_attention_heads": 3, "num_key_value_heads": 3, "hidden_size": 96}')
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "engine.tensor_parallel: 2 does not divide the model's num_attention_heads (3)" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_scale_measures_the_communication_a_split_adds(tmp_path):
    # the profiler's trace of the split run: its all-reduces (4 a block) are a measured share of the step
    proc = scale("tiny", "--nproc", "2", "--set", "engine.tensor_parallel=2", "--steps", "4", "--out",
                 str(tmp_path / "series"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["runs"]
    assert (row["nproc"], row["replicas"], row["efficiency"]) == (2, 1, 1.0)
    assert row["communication_ms"] > 0 and 0 < row["communication"] < 1, row


def test_a_llama_s_plan_splits_its_embedding_by_vocabulary_rows_and_gathers_its_logits():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolkit.train.tensor_parallel import hf_plan

    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=4, vocab_size=256))
    plan = hf_plan(model)
    assert isinstance(plan["model.embed_tokens"], RowwiseParallel)  # the class's "embedding_rowwise"
    assert isinstance(plan["lm_head"], ColwiseParallel) and plan["lm_head"].output_layouts == (Replicate(),)
    assert isinstance(plan["model.layers.*.self_attn.q_proj"], ColwiseParallel)
    assert isinstance(plan["model.layers.*.self_attn.o_proj"], RowwiseParallel)
