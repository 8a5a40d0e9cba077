"""engine.pipeline_parallel's rules before a run starts (the config, the world at launch, a checkpoint's manifest),
how the blocks are dealt to the stages, and which replica each rank serves (toolkit.train.pipeline_parallel)."""

from __future__ import annotations

import pytest
import torch

from toolkit import config as config_mod
from toolkit.checkpoint.store import manifest_problem
from toolkit.errors import RefusedValue
from toolkit.resources import memory_model, zero_stages
from toolkit.train.distributed import Topology
from toolkit.train.engines import check_engine
from toolkit.train.pipeline_parallel import stage_blocks


def load(overrides):
    return config_mod.load("tiny", ["train.grad_accum_steps=2", "train.batch_size=4", *overrides])


@pytest.mark.parametrize("n_layer, stages, blocks", [
    (2, 2, [[0], [1]]),
    (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
    (12, 3, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]),
    (5, 1, [[0, 1, 2, 3, 4]]),
])
def test_each_stage_runs_consecutive_blocks_as_even_as_they_divide(n_layer, stages, blocks):
    assert [list(r) for r in stage_blocks(n_layer, stages)] == blocks


@pytest.mark.parametrize("override, message", [
    ("engine.name=deepspeed", "engine.name: 'deepspeed' is not supported with engine.pipeline_parallel=2; allowed: "
                              "'torch'"),
    ("model.lora.rank=4;model.lora.target_modules=[qkv]", "model.lora.rank: 4 is not supported"),
    ("train.compile=true", "train.compile: True is not supported"),
    ("engine.precision=fp16", "engine.precision: 'fp16' is not supported"),
    ("train.grad_accum_steps=1", "train.grad_accum_steps: 1 is fewer than the 2 stages: 1F1B needs a micro-batch in "
                                 "flight per stage; allowed: at least engine.pipeline_parallel (2)"),
    ("model.n_layer=1", "model.n_layer: 1 is fewer than the 2 stages"),
    ("data.pack=true;data.chat=messages", "data.pack: True is not supported"),
])
def test_what_the_stages_do_not_support_is_refused_naming_the_field(override, message):
    with pytest.raises(config_mod.ConfigError) as caught:
        load(["engine.pipeline_parallel=2", *override.split(";")])
    assert message in str(caught.value)


def test_only_the_built_in_gpt_is_cut_into_stages():
    with pytest.raises(config_mod.ConfigError) as caught:
        config_mod.load("llama", ["engine.pipeline_parallel=2", "train.grad_accum_steps=2"])
    assert "model.name: 'hf' is not supported with engine.pipeline_parallel=2" in str(caught.value)


def test_the_stages_must_divide_the_processes_at_launch():
    cfg = load(["engine.pipeline_parallel=2", "engine.nproc=3"])
    with pytest.raises(RefusedValue) as caught:
        check_engine(cfg, world=3, cuda=False)
    assert "engine.pipeline_parallel: 2 does not divide the run's 3 processes" in str(caught.value)
    assert check_engine(cfg, world=4, cuda=False) is None


def test_a_pipeline_s_stages_draw_the_same_batches_and_are_the_farthest_apart():
    # 8 processes, 2 stages: ranks 0-3 are stage 0 of replicas 0-3, ranks 4-7 stage 1 of the same replicas
    ranks = [Topology(rank, 0, 8, torch.device("cpu"), pipeline_parallel=2) for rank in range(8)]
    assert [t.dp_rank for t in ranks] == [0, 1, 2, 3, 0, 1, 2, 3] and {t.dp_size for t in ranks} == {4}
    # with tensor parallelism alone, a group is consecutive ranks
    split = [Topology(rank, 0, 8, torch.device("cpu"), tensor_parallel=2) for rank in range(8)]
    assert [t.dp_rank for t in split] == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("value", [0, 3, True, "2"])
def test_a_manifest_with_stages_that_do_not_divide_its_world_is_refused(value):
    manifest = {"step": 5, "world_size": 4, "pipeline_parallel": value, "trainer": {"step": 5, "train_seconds": 1.0,
                                                                                  "horizon": 10}, "files": {}}
    problem = manifest_problem(manifest, "step_00000005")
    assert problem is not None and problem.startswith(f"pipeline_parallel: {value!r} is not allowed"), problem


def test_the_guide_s_175b_layout_holds_a_128th_of_the_model_per_gpu():
    # Megatron-DeepSpeed's D-H-P: 1,024 GPUs = tensor 8 x pipeline 16 x data 8; ZeRO-1 partitions over the 8 replicas
    e = zero_stages.estimate(175e9, "bf16", 1, gpus=1024, tensor_parallel=8, pipeline_parallel=16)
    held = 175e9 / 128
    assert (e.weights_bytes, e.gradients_bytes, e.optimizer_bytes) == (2 * held, 2 * held, 16 * held / 8)
    assert e.formula().startswith("4 Ψ/128 + 16 Ψ/128 / 8 = ")
    with pytest.raises(config_mod.ConfigError, match="pipeline_parallel: 3 is not allowed; allowed: a divisor of the "
                                                     "128 GPUs left by tensor_parallel 8"):
        zero_stages.estimate(175e9, "bf16", 1, gpus=1024, tensor_parallel=8, pipeline_parallel=3)


def test_the_memory_prediction_counts_the_first_stage_and_its_micro_batches_in_flight():
    # tiny in 2 stages: rank 0 holds the token and position embeddings (256 x 32 + 32 x 32) and block 0 (12,416)
    cfg = load(["engine.pipeline_parallel=2", "engine.nproc=2", "checkpoint.every_steps=0"])
    assert zero_stages.params_per_rank(cfg) == 256 * 32 + 32 * 32 + 12_416
    p = memory_model.predict_run(cfg, device="cpu")
    terms = {t.name: t for t in p.terms}
    assert (p.params, p.whole_params, p.pipeline_parallel) == (zero_stages.params_per_rank(cfg), 34_112, 2)
    assert "DDP buckets" not in terms and "gradient all-reduce copy" not in terms  # one replica: nothing to average
    assert terms["torch.distributed.pipelining, imported"].bytes == memory_model.PIPELINING_IMPORT_MIB * 2**20
    # min(2 stages, 2 micro-batches) in flight, each 16 tensors a block for its 1 block and its output: B T C x 4 B
    assert terms["activations"].bytes == 2 * (16 * 1 + 1) * 4 * 32 * 32 * 4
    assert terms["activations"].formula.startswith("min(p, m)=2 x (16 L0 + 1) x B T C x 4 B; L0=1")
    replicated = memory_model.predict_run(load(["engine.pipeline_parallel=2", "engine.nproc=4"]), device="cpu")
    assert "gradient all-reduce copy" in {t.name for t in replicated.terms}


def test_stages_split_over_tensor_parallel_groups_need_a_whole_number_of_both():
    # 3-D: each of 2 stages split over 2 ranks is one replica of 4 ranks
    cfg = load(["engine.pipeline_parallel=2", "engine.tensor_parallel=2", "engine.nproc=2"])
    with pytest.raises(RefusedValue) as caught:
        check_engine(cfg, world=2, cuda=False)
    assert "engine.nproc: 2 processes are not a whole number of replicas of 4 ranks" in str(caught.value)
    assert check_engine(cfg, world=8, cuda=False) is None
    # rank 0 holds the first stage's split: half of its embedding (256 x 32) and of its one block's matrices, and
    # the position table and the block's norms whole
    assert zero_stages.params_per_rank(cfg) == 256 * 32 // 2 + 12_288 // 2 + 32 * 32 + 128
    ranks = [Topology(rank, 0, 8, torch.device("cpu"), tensor_parallel=2, pipeline_parallel=2) for rank in range(8)]
    assert [t.dp_rank for t in ranks] == [0, 0, 1, 1, 0, 0, 1, 1]
