"""Tensor and pipeline parallelism on NCCL: the built-in GPT split over 2 GPUs (engine.tensor_parallel=2) and in 2
pipeline stages (engine.pipeline_parallel=2) trains as one GPU does on the same global batch, step for step in fp32.
NCCL takes one GPU per rank (a second rank on the same GPU is refused as a duplicate), so these need two: on a
one-GPU machine they skip, saying so; tests/e2e has the same comparisons on gloo."""

from __future__ import annotations

import pytest

from gpu_helpers import GPT_4x128, QUIET, completed, sets, train

TWO_GPUS = "needs 2 GPUs: NCCL runs one rank a GPU"
# 4 micro-batches of 4: the same 16 rows a step as GPT_4x128's batch, and 1F1B's micro-batches for the stages
ACCUM = sets("train.batch_size=4", "train.grad_accum_steps=4", "train.max_steps=20", "train.log_every=1",
             "engine.tf32=false")


@pytest.fixture(scope="module")
def two_gpus(cuda_name):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(TWO_GPUS)


@pytest.mark.parametrize("layout", ["engine.tensor_parallel=2", "engine.pipeline_parallel=2"])
def test_a_model_split_over_two_gpus_trains_as_one_gpu_does(tmp_path, two_gpus, layout):
    proc, whole = train(tmp_path / "whole", "tiny", *GPT_4x128, *QUIET, *ACCUM)
    completed(proc, whole)
    proc, split = train(tmp_path / "split", "tiny", *GPT_4x128, *QUIET, *ACCUM, "--nproc", "2", *sets(layout))
    completed(proc, split)
    assert split.read_lineage()["device"]["backend"] == "nccl"
    a = {e["step"]: e["loss"] for e in whole.events("train")}
    b = {e["step"]: e["loss"] for e in split.events("train")}
    assert sorted(a) == sorted(b) == list(range(1, 21))
    worst = max(a, key=lambda s: abs(a[s] - b[s]))
    assert abs(a[worst] - b[worst]) < 1e-3, f"step {worst}: one GPU {a[worst]}, split {b[worst]}"
