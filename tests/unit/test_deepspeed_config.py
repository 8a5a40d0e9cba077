"""A user's DeepSpeed config merged with a Trainbook config (toolkit.train.engines.deepspeed_config): "auto" filled,
values taken into the Trainbook fields they mean, contradictions and bad files refused naming the key, and DeepSpeed's
own parser run over the result before launch. Pure logic: files in tmp_path, no process group, no training."""

from __future__ import annotations

import json

import pytest

from ds_examples import ZERO2_AUTO, ZERO2_OFFLOAD
from toolkit import config as config_mod
from toolkit.config import ConfigError
from toolkit.train.engines import check_engine
from toolkit.train.engines.deepspeed_config import DeepSpeedConfigError, check, merged

def load(tmp_path, ds: dict | str, *sets: str, name: str = "ds_config.json"):
    file = tmp_path / name
    file.write_text(ds if isinstance(ds, str) else json.dumps(ds))
    return config_mod.load("tiny", ["engine.name=deepspeed", f"engine.deepspeed_config={file}", *sets])


def refusal(tmp_path, ds, *sets, name="ds_config.json", world=1, cuda=False) -> str:
    with pytest.raises((ConfigError, DeepSpeedConfigError)) as caught:
        cfg = load(tmp_path, ds, *sets, name=name)
        check(cfg, world, cuda)
    return str(caught.value)


def test_auto_values_take_the_trainbook_config_and_the_file_keeps_the_rest(tmp_path):
    cfg = load(tmp_path, ZERO2_AUTO, "train.grad_accum_steps=2", "engine.nproc=2")
    assert cfg.engine.zero_stage == 2, "the file's stage goes into the Trainbook field (the loop and logs read it)"
    assert cfg.engine.deepspeed == ZERO2_AUTO, "the file's contents travel with the run"
    ds = check(cfg, world=2, cuda=False)
    assert ds["train_micro_batch_size_per_gpu"] == 8 and ds["gradient_accumulation_steps"] == 2
    assert ds["train_batch_size"] == 8 * 2 * 2, "micro batch x accumulation x processes"
    assert ds["gradient_clipping"] == cfg.optim.grad_clip
    assert ds["fp16"] == {**ZERO2_AUTO["fp16"], "enabled": False} and ds["bf16"] == {"enabled": False}
    assert ds["zero_optimization"]["reduce_bucket_size"] == 5e8, "keys Trainbook has no field for go as written"
    assert ds["optimizer"]["type"] == "AdamW" and ds["optimizer"]["params"]["lr"] == cfg.optim.lr


def test_a_file_value_fills_a_field_left_unset_and_a_contradiction_names_both(tmp_path):
    # tiny.yaml sets optim.lr explicitly
    message = refusal(tmp_path, {"optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}})
    assert "optimizer.params.lr: is 0.0003 in ds_config.json, but optim.lr is 0.003" in message
    assert '"auto" in the file' in message
    base = tmp_path / "base.yaml"
    base.write_text("model: {name: gpt, n_layer: 1, n_head: 1, n_embd: 16, block_size: 16}\n")
    (tmp_path / "ds.json").write_text(json.dumps({"optimizer": {"type": "AdamW", "params": {
        "lr": 3e-4, "betas": [0.8, 0.9], "weight_decay": 0.0}}, "gradient_clipping": 0.5,
        "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3}))
    cfg = config_mod.load(base, ["engine.name=deepspeed", f"engine.deepspeed_config={tmp_path / 'ds.json'}",
                                 "optim.min_lr=0"])
    assert (cfg.optim.lr, cfg.optim.beta1, cfg.optim.beta2, cfg.optim.weight_decay, cfg.optim.grad_clip) == \
        (3e-4, 0.8, 0.9, 0.0, 0.5)
    assert (cfg.train.batch_size, cfg.train.grad_accum_steps) == (4, 3)


def test_the_run_reads_its_kept_copy_not_the_file(tmp_path):
    cfg = load(tmp_path, ZERO2_AUTO)
    (tmp_path / "ds_config.json").write_text("changed after launch: not JSON")
    again = config_mod.from_dict(cfg.to_dict())  # how a worker, a restart or a resume reads config.yaml
    assert again == cfg
    assert merged(again, 1, False) == merged(cfg, 1, False)


def test_a_scheduler_section_becomes_the_trainbook_schedule(tmp_path):
    ds = {"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": "auto",
                                                           "total_num_steps": "auto"}}}
    cfg = load(tmp_path, ds)
    assert (cfg.optim.schedule, cfg.optim.warmup_steps) == ("linear", 5)
    assert "scheduler" not in merged(cfg, 1, False), "the loop sets the learning rate; DeepSpeed must not as well"
    assert "scheduler.params.cos_min_ratio: 0.1 has no Trainbook equivalent" in refusal(
        tmp_path, {"scheduler": {"type": "WarmupCosineLR", "params": {"cos_min_ratio": 0.1}}})
    assert "scheduler.type: 'OneCycle' is not allowed" in refusal(tmp_path, {"scheduler": {"type": "OneCycle"}})


@pytest.mark.parametrize("ds, name, expected", [
    ("{not json", "ds_config.json", "engine.deepspeed_config: '"),
    ("[1, 2]", "ds_config.json", "holds a list, not a mapping"),
    ("zero_optimization: [", "ds.yaml", "is not valid YAML"),
    ("\xff\xfe", "ds_config.json", "is not valid JSON"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_sise": 5}}, "ds_config.json",
     "zero_optimization.reduce_bucket_sise: is not a key DeepSpeed reads here (did you mean "
     "zero_optimization.reduce_bucket_size?)"),
    ({"steps_pr_print": 5}, "ds_config.json", "steps_pr_print: is not a key DeepSpeed reads (did you mean "
                                              "'steps_per_print'?)"),
    ({"fp16": {"enabled": True, "loss_scael": 5}}, "ds_config.json", "fp16.loss_scael"),
    ({"zero_optimization": {"stage": 7}}, "ds_config.json", "engine.zero_stage: 7 is out of range"),
    ({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "sub_group_size": "auto"}},
     "ds_config.json", 'zero_optimization.sub_group_size: is "auto", and no Trainbook field sets it'),
], ids=["not-json", "not-a-mapping", "not-yaml", "not-text", "misspelt-nested", "misspelt-top", "misspelt-fp16",
        "stage-out-of-range", "auto-without-a-field"])
def test_bad_files_are_refused_naming_the_key(tmp_path, ds, name, expected):
    assert expected in refusal(tmp_path, ds, name=name)


def test_yaml_files_are_read_too(tmp_path):
    cfg = load(tmp_path, "zero_optimization:\n  stage: 3\nbf16:\n  enabled: true\n", name="ds.yaml")
    assert (cfg.engine.zero_stage, cfg.engine.precision) == (3, "bf16")
    assert check(cfg, 1, False)["bf16"]["enabled"] is True


def test_batch_arithmetic_is_refused_with_the_sum(tmp_path):
    # tiny.yaml sets train.batch_size=8 explicitly: a total of 24 over 1 process leaves 3 accumulation steps
    assert load(tmp_path, {"train_batch_size": 24}).train.grad_accum_steps == 3
    message = refusal(tmp_path, {"train_batch_size": 20})
    assert "train_batch_size: 20 in ds_config.json is not a whole number of micro-batches of 8 x 1 processes " \
           "(20 / (8 x 1) = 2.5)" in message and "a multiple of 8" in message
    message = refusal(tmp_path, {"train_batch_size": 32}, "train.grad_accum_steps=3")
    assert "is not train_micro_batch_size_per_gpu x gradient_accumulation_steps x processes = 8 x 3 x 1 = 24" \
        in message
    # the micro batch left open: the accumulation steps must divide the total
    base = tmp_path / "base.yaml"
    base.write_text("model: {name: gpt, n_layer: 1, n_head: 1, n_embd: 16, block_size: 16}\n")
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 32}))
    message = str(pytest.raises(ConfigError, config_mod.load, base, [
        "engine.name=deepspeed", f"engine.deepspeed_config={tmp_path / 'ds.json'}", "train.grad_accum_steps=3",
        "engine.nproc=2"]).value)
    assert "32 in ds.json does not divide into train.grad_accum_steps=3 micro-steps x 2 processes " \
           "(32 / (3 x 2) = 5.333)" in message
    assert config_mod.load(base, ["engine.name=deepspeed", f"engine.deepspeed_config={tmp_path / 'ds.json'}",
                                  "train.grad_accum_steps=4", "engine.nproc=2"]).train.batch_size == 4


def test_fp16_and_offload_need_a_gpu_and_pass_where_there_is_one(tmp_path):
    message = refusal(tmp_path, ZERO2_OFFLOAD)
    assert "zero_optimization.offload_optimizer.device: 'cpu' moves state out of GPU memory" in message
    cfg = load(tmp_path, ZERO2_OFFLOAD, "engine.precision=fp16")
    ds = check(cfg, world=16, cuda=True)  # an Azure ML GPU SKU: DeepSpeed's parser accepts it offline
    assert ds["zero_optimization"]["offload_optimizer"] == {"device": "cpu", "pin_memory": True}
    assert ds["fp16"]["enabled"] is True and "torch_adam" not in ds["optimizer"]["params"]
    assert ds["optimizer"]["params"]["eps"] == 1e-8
    assert "fp16.enabled: True needs a GPU" in refusal(tmp_path, {"fp16": {"enabled": True}})
    torch_cfg = config_mod.load("tiny", ["engine.precision=fp16"])
    with pytest.raises(ValueError, match="engine.precision: 'fp16' needs a GPU"):
        check_engine(torch_cfg, world=1, cuda=False)
    assert check_engine(torch_cfg, world=1, cuda=True) is None
    nvme = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}
    assert "offload_param.nvme_path: is missing" in refusal(tmp_path, nvme, cuda=True)
    stage2_params = {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    assert "ZeRO stage 3 (only stage 3 partitions the parameters)" in refusal(tmp_path, stage2_params, cuda=True)


def test_a_deepspeed_file_needs_the_deepspeed_engine(tmp_path):
    (tmp_path / "ds.json").write_text("{}")
    with pytest.raises(ConfigError, match="engine.deepspeed_config: .* is set while engine.name='torch'"):
        config_mod.load("tiny", [f"engine.deepspeed_config={tmp_path / 'ds.json'}"])
