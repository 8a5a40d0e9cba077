"""A user's DeepSpeed config merged with a Trainbook config (toolkit.deepspeed_config): "auto" filled,
values taken into the Trainbook fields they mean, contradictions and bad files refused naming the key, and DeepSpeed's
own parser run over the result before launch. Pure logic: files in tmp_path, no process group, no training."""

from __future__ import annotations

import json

import pytest

from ds_examples import ZERO2_AUTO, ZERO2_OFFLOAD
from toolkit import config as config_mod
from toolkit.config import ConfigError
from toolkit.train.engines import check_engine
from toolkit.deepspeed_config import DeepSpeedConfigError, check, merged

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
    cfg = load(tmp_path, ds, "optim.min_lr=0")
    assert (cfg.optim.schedule, cfg.optim.warmup_steps, cfg.optim.min_lr) == ("linear", 5, 0.0)
    assert "scheduler.type: is 'WarmupDecayLR' in ds_config.json, but optim.min_lr is 0.0003" in refusal(tmp_path, ds), \
        "WarmupDecayLR decays to 0: tiny.yaml's explicit min_lr contradicts it"
    assert "scheduler" not in merged(cfg, 1, False), "the loop sets the learning rate; DeepSpeed must not as well"
    assert "scheduler.params.cos_min_ratio: 0.1 has no Trainbook equivalent" in refusal(
        tmp_path, {"scheduler": {"type": "WarmupCosineLR", "params": {"cos_min_ratio": 0.1}}})
    assert "scheduler.type: 'OneCycle' is not allowed" in refusal(tmp_path, {"scheduler": {"type": "OneCycle"}})


@pytest.mark.parametrize("ds, name, expected", [
    ("{not json", "ds_config.json", "engine.deepspeed_config: '"),
    ("[1, 2]", "ds_config.json", "holds a list, not a mapping"),
    ("zero_optimization: [", "ds.yaml", "not valid YAML"),
    ("\xff\xfe", "ds_config.json", "not valid JSON"),
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


def test_on_a_gpu_without_fused_adam_deepspeed_steps_with_torch_adamw_unless_the_file_says_otherwise(tmp_path):
    """DeepSpeed's default Adam on a GPU is FusedAdam, a CUDA op built at first use with nvcc; where the package has it
    prebuilt or nvcc is there it is kept, elsewhere (a pip torch, DeepSpeed from PyPI) torch's AdamW steps instead of
    the run failing at its first step. A file's own torch_adam, another optimizer, or optimizer offload (DeepSpeed's
    CPU Adam, built with g++) are left alone."""
    from toolkit.third_party import import_deepspeed

    import_deepspeed()
    from toolkit.deepspeed_config import fall_back_to_torch_adam, fused_adam_unavailable

    ds = merged(load(tmp_path, {}), world=1, cuda=True)
    assert "torch_adam" not in ds["optimizer"]["params"], "FusedAdam is DeepSpeed's choice on a GPU"
    why = fall_back_to_torch_adam(ds)
    assert (why is None) == (fused_adam_unavailable() is None)
    assert ds["optimizer"]["params"].get("torch_adam", False) is (why is not None)
    if why is not None:
        assert "fused_adam" in why and "nvcc" in why, why
    for kept in ({"optimizer": {"params": {"torch_adam": False}}}, {"optimizer": {"type": "Lamb", "params": {}}},
                 ZERO2_OFFLOAD):
        ds = merged(load(tmp_path, kept), world=1, cuda=True)
        before = json.dumps(ds, sort_keys=True)
        assert fall_back_to_torch_adam(ds) is None and json.dumps(ds, sort_keys=True) == before, kept


def test_a_deepspeed_file_needs_the_deepspeed_engine(tmp_path):
    (tmp_path / "ds.json").write_text("{}")
    with pytest.raises(ConfigError, match="engine.deepspeed_config: .* is set while engine.name='torch'"):
        config_mod.load("tiny", [f"engine.deepspeed_config={tmp_path / 'ds.json'}"])


@pytest.mark.parametrize("ds, expected", [
    ({"optimizer": 3}, "optimizer: 3 is not allowed; allowed: a section (a mapping of settings)"),
    ({"zero_optimization": "x"}, "zero_optimization: 'x' is not allowed; allowed: a section"),
    ({"fp16": "auto"}, "fp16: 'auto' is not allowed; allowed: a section"),
    ({"optimizer": {"params": [1]}}, "optimizer.params: [1] is not allowed; allowed: a section"),
    ({"optimizer": {"type": 5}}, "optimizer.type: 5 is not allowed; allowed: a name"),
    ({"scheduler": {"type": ["x"]}}, "scheduler.type: ['x'] is not allowed"),
    ({"scheduler": {"type": "WarmupLR", "params": "abc"}}, "scheduler.params: 'abc' is not allowed; allowed: a section"),
    ({"gradient_clipping": "1.0"}, "gradient_clipping: '1.0' is not allowed; allowed: a finite number for "
                                   "optim.grad_clip"),
    ({"optimizer": {"type": "AdamW", "params": {"betas": [0.8]}}}, "optimizer.params.betas: [0.8] is not allowed; "
                                                                   "allowed: a list of two numbers"),
    ({"optimizer": {"type": "AdamW", "params": {"weight_decay": True}}}, "optimizer.params.weight_decay: True is not "
                                                                         "allowed; allowed: a finite number"),
    ({"train_micro_batch_size_per_gpu": 2.5}, "train_micro_batch_size_per_gpu: 2.5 is not allowed; allowed: a whole"),
    ({"fp16": {"enabled": 1}}, "fp16.enabled: 1 is not allowed; allowed: true, false or \"auto\""),
    ({"managed_gradient_accumulation": False}, "managed_gradient_accumulation: False is not allowed"),
    ({"elasticity": {"enabled": False}}, "DeepSpeed's parser refuses the merged config"),
    ({"steps_per_print": 0}, "steps_per_print: 0 is not allowed; allowed: a whole number >= 1"),
    ('{"a": 1, "a": 2}', "the key 'a' appears twice"),
    ("[" * 100000, "nested deeper than"),
], ids=["optimizer-number", "zero-string", "fp16-auto", "params-list", "type-number", "scheduler-type-list",
        "scheduler-params-string", "clip-string", "betas-one", "decay-bool", "micro-float", "fp16-one",
        "managed-accumulation-off", "removed-key", "steps-per-print-0", "duplicate-key", "deep"])
def test_malformed_settings_are_refused_naming_the_key_never_a_traceback(tmp_path, ds, expected):
    message = refusal(tmp_path, ds)
    assert expected in message and message.startswith("engine.deepspeed_config"), message


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path):
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    assert "an anchor or alias" in refusal(tmp_path, bomb, name="ds.yaml")


@pytest.mark.parametrize("make, expected", [
    (lambda d: d / "missing.json", "cannot be read"),
    (lambda d: d, "is a directory, not a regular file"),
    (lambda d: (d / "link.json").symlink_to(d / "real.json") or d / "link.json", "is a symbolic link"),
], ids=["missing", "directory", "symlink"])
def test_a_path_that_is_not_a_regular_file_is_refused(tmp_path, make, expected):
    (tmp_path / "real.json").write_text("{}")
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=expected):
        config_mod.load("tiny", ["engine.name=deepspeed", f"engine.deepspeed_config={path}"])


def test_the_files_total_batch_is_held_to_the_world_the_run_has(tmp_path):
    cfg = load(tmp_path, {"train_batch_size": 64})  # tiny's batch of 8 on 1 process: 8 accumulation steps
    assert cfg.train.grad_accum_steps == 8 and check(cfg, world=1, cuda=False)["train_batch_size"] == 64
    with pytest.raises(DeepSpeedConfigError, match="64 in the DeepSpeed config is not .* = 8 x 8 x 4 = 256"):
        check(cfg, world=4, cuda=False)
    assert check(load(tmp_path, {"train_batch_size": "auto"}), world=4, cuda=False)["train_batch_size"] == 32


def test_a_saved_config_never_reads_the_file_and_a_changed_file_is_not_trained_on_silently(tmp_path):
    cfg = load(tmp_path, ZERO2_AUTO)
    saved = tmp_path / "config.yaml"
    saved.write_text(cfg.to_yaml())
    assert config_mod.load(saved) == cfg, "the kept copy agrees with the file: the same run"
    (tmp_path / "ds_config.json").write_text(json.dumps({**ZERO2_AUTO, "steps_per_print": 10}))
    with pytest.raises(ConfigError, match="engine.deepspeed: .* differs from that file now"):
        config_mod.load(saved)
    (tmp_path / "ds_config.json").unlink()  # a resume, an Azure ML node: the file is gone, the copy is the source
    assert config_mod.load(saved) == cfg and config_mod.from_dict(cfg.to_dict()) == cfg
    (tmp_path / "ds_config.json").write_text(json.dumps(ZERO2_AUTO))
    with pytest.raises(ConfigError, match="differs from that file now"):  # a --set beside a file is not a merge
        load(tmp_path, ZERO2_AUTO, "engine.deepspeed.wall_clock_breakdown=true")


def test_the_bfloat16_spelling_is_read_as_bf16(tmp_path):
    cfg = load(tmp_path, {"bfloat16": {"enabled": True}})
    assert cfg.engine.precision == "bf16"
    assert check(cfg, 1, False)["bf16"]["enabled"] is True
