"""engine.tensor_parallel's rules before a run starts (the config, the world at launch), and the fused q/k/v layout
conversion that lets a split GPT save whole tensors (toolkit.train.tensor_parallel)."""

from __future__ import annotations

import pytest
import torch

from toolkit import config as config_mod
from toolkit.errors import RefusedValue
from toolkit.resources import memory_model, zero_stages
from toolkit.train.engines import check_engine
from toolkit.train.tensor_parallel import _fused_rows, _unfuse


@pytest.mark.parametrize("n", [1, 2, 4])
def test_each_rank_gets_its_slice_of_q_k_and_v_and_the_whole_comes_back(n):
    width = 8
    full = torch.arange(3 * width * 2, dtype=torch.float32).reshape(3 * width, 2)  # rows: q 0-7, k 8-15, v 16-23
    q, k, v = full.chunk(3)
    ranks = [_fused_rows(full, 3, n, i) for i in range(n)]
    for i, rows in enumerate(ranks):
        assert torch.equal(rows, torch.cat([q.chunk(n)[i], k.chunk(n)[i], v.chunk(n)[i]]))
    assert torch.equal(_unfuse(torch.cat(ranks), 3, n), full)  # the DTensor's gather lays the ranks end to end


def load(overrides):
    return config_mod.load("tiny", overrides)


@pytest.mark.parametrize("override, field", [
    ("engine.name=deepspeed", "engine.name: 'deepspeed' is not supported with engine.tensor_parallel=2; allowed: "
                              "'torch'"),
    ("model.lora.rank=4;model.lora.target_modules=[qkv]", "model.lora.rank: 4 is not supported"),
    ("train.compile=true", "train.compile: True is not supported"),
    ("engine.precision=fp16", "engine.precision: 'fp16' is not supported"),
])
def test_what_the_split_does_not_support_is_refused_naming_the_field(override, field):
    with pytest.raises(config_mod.ConfigError) as caught:
        load(["engine.tensor_parallel=2", *override.split(";")])
    assert field in str(caught.value)


def test_a_model_without_a_plan_is_refused():
    with pytest.raises(config_mod.ConfigError) as caught:
        config_mod.load("tiny", ["engine.tensor_parallel=2", "model.name=digits_mlp", "data.dataset=digits"])
    assert "model.name: 'digits_mlp' is not supported with engine.tensor_parallel=2" in str(caught.value)


def test_heads_that_do_not_split_evenly_are_refused():
    # tiny has 2 heads
    with pytest.raises(config_mod.ConfigError) as caught:
        load(["engine.tensor_parallel=4"])
    assert "engine.tensor_parallel: 4 does not divide model.n_head (2)" in str(caught.value)
    assert load(["engine.tensor_parallel=2"]).engine.tensor_parallel == 2


def test_the_split_must_divide_the_processes_at_launch():
    cfg = load(["engine.tensor_parallel=2", "engine.nproc=3"])
    with pytest.raises(RefusedValue) as caught:
        check_engine(cfg, world=3, cuda=False)
    assert "engine.tensor_parallel: 2 does not divide the run's 3 processes" in str(caught.value)
    assert check_engine(cfg, world=4, cuda=False) is None


def test_each_rank_holds_half_of_every_split_matrix_and_all_of_the_rest():
    # tiny: 2 blocks, width 32, 32 positions. Split: per block q k v (3 x 32 x 32), proj (32 x 32), MLP (2 x 4 x 32
    # x 32) = 12,288, and the tied 256 x 32 embedding; whole: each block's two LayerNorms (128), the 32 x 32 position
    # table and ln_f (64).
    split, whole = 2 * 12_288 + 256 * 32, 2 * 128 + 32 * 32 + 64
    cfg = load(["engine.tensor_parallel=2", "engine.nproc=2"])
    assert zero_stages.model_params(cfg) == split + whole == 34_112
    assert zero_stages.params_per_rank(cfg) == split // 2 + whole == 17_728


def test_the_memory_prediction_counts_one_rank_s_share():
    cfg = load(["engine.tensor_parallel=2", "engine.nproc=4", "checkpoint.every_steps=0"])
    p = memory_model.predict_run(cfg, device="cpu")
    terms = {t.name: t.bytes for t in p.terms}
    assert (p.params, p.whole_params, p.tensor_parallel) == (17_728, 34_112, 2)
    assert terms["weights"] == 4 * 17_728 and terms["Adam moments"] == 8 * 17_728
    assert terms["gradient all-reduce copy"] == 4 * 17_728 and "DDP buckets" not in terms  # 2 replicas, no DDP
    assert terms["torch.distributed.tensor, imported"] == memory_model.DTENSOR_IMPORT_MIB * memory_model.MIB
    # per block 4 whole + 12 / 2 split activations of B T C; the head's 2 whole and the logits' 256 / 32 / 2
    B, T, C = cfg.train.batch_size, 32, 32
    assert terms["activations"] == ((4 + 12 / 2) * 2 + 2 + 256 / C / 2) * B * T * C * 4
    one_replica = memory_model.predict_run(load(["engine.tensor_parallel=2", "engine.nproc=2"]), device="cpu")
    assert "gradient all-reduce copy" not in {t.name for t in one_replica.terms}


def test_a_group_may_not_straddle_two_nodes():
    cfg = load(["engine.tensor_parallel=4", "model.n_head=4", "engine.nproc=2"])
    with pytest.raises(RefusedValue) as caught:
        check_engine(cfg, world=8, cuda=False, per_node=2)  # 4 nodes of 2: the world divides, a node does not
    assert "engine.tensor_parallel: 4 does not divide the 2 processes of a node" in str(caught.value)
    assert check_engine(cfg, world=8, cuda=False, per_node=4) is None


def test_the_gpu_table_splits_each_layer_then_partitions_over_the_replicas():
    # 175B in bf16 on 1,024 GPUs at tensor_parallel 8: each GPU holds Ψ/8 and ZeRO-2 partitions over 128 replicas
    psi = 175e9
    e = zero_stages.estimate(psi, "bf16", 2, 1024, tensor_parallel=8)
    assert e.total_bytes == pytest.approx(2 * psi / 8 + 18 * psi / 8 / 128)
    assert e.formula().startswith("2 Ψ/8 + 18 Ψ/8 / 128 = ")
    assert zero_stages.estimate(psi, "bf16", 2, 1024).total_bytes == pytest.approx(2 * psi + 18 * psi / 1024)
    advice = zero_stages.recommend_stage(psi, 80, 1024, "bf16", tensor_parallel=8)
    assert advice.stage == 2  # ZeRO-1 needs 84 GiB a GPU; without the split ZeRO-2 would need 329 GiB
    with pytest.raises(config_mod.ConfigError, match="tensor_parallel: 3 is not allowed; allowed: a divisor of the 8"):
        zero_stages.estimate(psi, "bf16", 0, 8, tensor_parallel=3)
