"""Pipeline parallelism (engine.pipeline_parallel) through the CLI on 2 and 4 gloo processes: the GPT cut into two
stages trains as the whole model does in one process, step for step, its micro-batches in torch's 1F1B schedule;
pipelines replicated over data-parallel ranks average their gradients as DDP does; checkpoints hold whole tensors,
so a run saved in stages resumes unsplit and the other way round. The exact resume at the same layout is in
test_checkpoint's GOLDEN table (torch-pp-2-accum)."""

from __future__ import annotations

import json

import pytest

from conftest import cli
from test_checkpoint import ACCUM, CKPT, TORCH_1, TORCH_PP_2, reference_runs  # noqa: F401
from test_scaling import scale  # a series borrows every core, as test_scaling's do
from test_tensor_parallel import assert_same_losses, lineage, n_params
from toolkit.resources import zero_stages

pytestmark = pytest.mark.slow


def test_gpt_in_two_stages_trains_as_one_process_does(reference_runs):
    staged, whole = reference_runs(TORCH_PP_2), reference_runs(TORCH_1 + ACCUM)
    assert_same_losses(staged, whole)
    evals = {e["step"]: e["val_loss"] for e in staged.events("eval")}
    assert evals and evals == pytest.approx({e["step"]: e["val_loss"] for e in whole.events("eval")}, abs=1e-4)
    # one replica of two ranks: rank 0 holds the embeddings and the first block, rank 1 the second block and a copy of
    # the (tied) output layer
    parallel, total = lineage(staged)["parallel"], n_params(staged)
    assert (parallel["processes"], parallel["pipeline_parallel"], parallel["data_parallel"]) == (2, 2, 1)
    assert parallel["parameters_per_rank"] == zero_stages.params_per_rank(staged.read_config()) < 0.7 * total


def test_saved_stages_resume_unsplit_and_an_unsplit_run_resumes_in_stages(reference_runs, finished_run_copy):
    whole = reference_runs(TORCH_1 + ACCUM)
    staged = finished_run_copy(*CKPT, *TORCH_PP_2, name="staged")
    proc = cli("resume", str(staged.path), "--from", "step_00000020", "--set", "engine.nproc=1",
               "--set", "engine.pipeline_parallel=1")
    assert proc.returncode == 0 and "resuming from step_00000020" in proc.stderr, proc.stderr[-3000:]
    assert_same_losses(staged, whole)
    unsplit = finished_run_copy(*CKPT, *TORCH_1, *ACCUM, name="unsplit")
    proc = cli("resume", str(unsplit.path), "--from", "step_00000020", "--set", "engine.nproc=2",
               "--set", "engine.pipeline_parallel=2")
    assert proc.returncode == 0 and "resuming from step_00000020" in proc.stderr, proc.stderr[-3000:]
    assert_same_losses(unsplit, whole)
    assert lineage(unsplit)["parallel"]["pipeline_parallel"] == 2


def test_a_stage_change_that_changes_the_replicas_is_refused_with_nothing_written(finished_run_copy):
    run = finished_run_copy(*CKPT, *TORCH_PP_2)
    before = run.config_path.read_bytes()
    proc = cli("resume", str(run.path), "--from", "step_00000020", "--set", "engine.pipeline_parallel=1")
    assert proc.returncode != 0 and "2 data-parallel replicas where it had 1" in proc.stderr, proc.stderr
    odd = cli("resume", str(run.path), "--set", "engine.nproc=3", "--set", "train.max_steps=50")
    assert odd.returncode == 2 and "engine.pipeline_parallel: 2 does not divide the run's 3 processes" in odd.stderr
    assert run.config_path.read_bytes() == before


def test_replicated_pipelines_average_their_gradients_as_ddp_does(finished_runs):
    # 4 processes: 2 replicas of a 2-stage pipeline against plain DDP over 2 processes, the same batches per replica;
    # a low clipping threshold makes every step's update depend on the global norm, summed over the stages
    short = ("--set", "train.max_steps=12", "--set", "train.log_every=1", "--set", "train.eval_every=12",
             "--set", "optim.grad_clip=0.05", *ACCUM)
    # with activation checkpointing too (each stage's blocks recomputed in backward), which changes no loss
    staged = finished_runs("--nproc", "4", "--set", "engine.pipeline_parallel=2", "--set",
                           "model.activation_checkpointing=true", *short)
    assert lineage(staged)["parallel"]["data_parallel"] == 2
    assert_same_losses(staged, finished_runs("--nproc", "2", *short), steps=range(1, 13))


def test_scale_measures_the_communication_the_stages_add(tmp_path):
    # the profiler's trace of a pipeline: the stages' sends and receives (and the waits of the bubble) are a measured
    # share of the step
    proc = scale("tiny", "--nproc", "2", "--set", "engine.pipeline_parallel=2", "--set", "train.grad_accum_steps=2",
                 "--set", "train.batch_size=4", "--steps", "4", "--out", str(tmp_path / "series"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["runs"]
    assert (row["nproc"], row["replicas"], row["efficiency"]) == (2, 1, 1.0)
    assert row["communication_ms"] > 0 and 0 < row["communication"] < 1, row


def test_stages_split_over_tensor_parallel_ranks_train_as_one_process_does_and_resume_unsplit(reference_runs,
                                                                                             finished_run_copy):
    # 3-D's two inner dimensions on 4 processes: 2 stages, each split over 2 ranks (Megatron's D-H-P with D = 1)
    whole = reference_runs(TORCH_1 + ACCUM)
    run = finished_run_copy(*CKPT, "--nproc", "4", "--set", "engine.pipeline_parallel=2", "--set",
                            "engine.tensor_parallel=2", *ACCUM)
    assert_same_losses(run, whole)
    parallel = lineage(run)["parallel"]
    assert (parallel["processes"], parallel["tensor_parallel"], parallel["pipeline_parallel"]) == (4, 2, 2)
    assert parallel["parameters_per_rank"] == zero_stages.params_per_rank(run.read_config())
    proc = cli("resume", str(run.path), "--from", "step_00000020", "--set", "engine.nproc=1", "--set",
               "engine.pipeline_parallel=1", "--set", "engine.tensor_parallel=1")
    assert proc.returncode == 0 and "resuming from step_00000020" in proc.stderr, proc.stderr[-3000:]
    assert_same_losses(run, whole)
