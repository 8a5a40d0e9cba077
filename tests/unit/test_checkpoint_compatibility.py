"""check_compatible: a resume refuses a checkpoint written by another model, optimizer, engine or world size,
naming every difference; loop length, logging, checkpoint and fault settings may change between attempts."""

from __future__ import annotations

import pytest

from toolkit import config as config_mod
from toolkit.checkpoint.store import RESUMABLE_CHANGES, CheckpointError, check_compatible


def manifest(overrides: list[str] = (), step: int = 20, world_size: int = 1) -> dict:
    return {"step": step, "world_size": world_size, "config": config_mod.load("tiny", list(overrides)).to_dict()}


def run_config(overrides: list[str] = ()) -> dict:
    return config_mod.load("tiny", list(overrides)).to_dict()


def refusal(checkpoint: dict, config: dict, world_size: int = 1) -> str:
    with pytest.raises(CheckpointError) as caught:
        check_compatible(checkpoint, config, world_size)
    return str(caught.value)


def test_the_same_config_is_compatible():
    check_compatible(manifest(), run_config(), 1)
    check_compatible(manifest(world_size=2), run_config(), 2)


@pytest.mark.parametrize("override", [
    "name=renamed", "train.max_steps=400", "train.max_seconds=60", "train.eval_every=7", "train.eval_batches=2",
    "train.log_every=1", "profile.enabled=true", "checkpoint.every_steps=5", "checkpoint.keep_last=9",
    "checkpoint.mode=sync", "fault.kill_at_step=12", "data.num_workers=2", "data.prefetch_factor=4",
])
def test_settings_that_do_not_change_a_step_may_differ(override):
    check_compatible(manifest(), run_config([override]), 1)


@pytest.mark.parametrize("override, difference", [
    ("model.n_embd=64", "model.n_embd: checkpoint 32, this run 64"),
    ("model.activation=gelu", "model.activation: checkpoint 'silu', this run 'gelu'"),
    ("optim.lr=0.002", "optim.lr: checkpoint 0.003, this run 0.002"),
    ("optim.schedule=constant", "optim.schedule: checkpoint 'cosine', this run 'constant'"),
    ("train.batch_size=4", "train.batch_size: checkpoint 8, this run 4"),
    ("train.seed=1", "train.seed: checkpoint 1337, this run 1"),
    ("engine.precision=bf16", "engine.precision: checkpoint 'fp32', this run 'bf16'"),
    ("data.val_fraction=0.2", "data.val_fraction: checkpoint 0.1, this run 0.2"),
])
def test_a_different_setting_is_refused_naming_the_checkpoint_both_values_and_what_may_differ(override, difference):
    message = refusal(manifest(), run_config([override]))
    assert message.startswith("checkpoint step_00000020 was written with a different config: "), message
    assert difference in message
    assert message.endswith(". Allowed to differ: " + ", ".join(RESUMABLE_CHANGES))


def test_every_difference_is_named_in_a_stable_order():
    message = refusal(manifest(), run_config(["train.batch_size=4", "model.n_embd=64", "optim.lr=0.002"]))
    listed = message.split(": ", 1)[1].split(". Allowed")[0]
    assert listed == ("model.n_embd: checkpoint 32, this run 64; optim.lr: checkpoint 0.003, this run 0.002; "
                      "train.batch_size: checkpoint 8, this run 4")


def test_a_resumable_change_beside_a_real_one_is_not_listed():
    message = refusal(manifest(), run_config(["train.max_steps=400", "model.n_layer=3"]))
    assert "model.n_layer" in message and "max_steps: checkpoint" not in message


def test_a_different_world_size_is_refused_before_the_config_is_compared():
    message = refusal(manifest(["model.n_embd=64"], world_size=2), run_config(), world_size=1)
    assert message == ("checkpoint step_00000020 was written by 2 processes; this run has 1 (engine.nproc): 1 "
                       "data-parallel replicas where it had 2 (processes / engine.tensor_parallel / "
                       "engine.pipeline_parallel). Allowed: the same number of replicas, each drawing the batches it "
                       "drew before (or data.sampling=epochs, whose position survives a change of replicas)")


@pytest.mark.parametrize("written, now", [((2, 2), (1, 1)), ((1, 1), (2, 2)), ((4, 2), (2, 1)), ((8, 4), (2, 1))])
def test_the_processes_may_change_where_the_replicas_do_not(written, now):
    # (processes, engine.tensor_parallel): whole tensors on disk, so only the data-parallel replicas must match
    checkpoint = {**manifest(world_size=written[0]), "tensor_parallel": written[1]}
    check_compatible(checkpoint, run_config([f"engine.nproc={now[0]}", f"engine.tensor_parallel={now[1]}"]), *now)


@pytest.mark.parametrize("written, now", [((2, 2), (1, 1)), ((1, 1), (2, 2)), ((4, 2), (2, 1)), ((4, 2), (4, 2))])
def test_a_pipeline_may_change_its_stages_where_the_replicas_do_not(written, now):
    # (processes, engine.pipeline_parallel): whole tensors on disk, as for tensor parallelism
    checkpoint = {**manifest(world_size=written[0]), "pipeline_parallel": written[1]}
    check_compatible(checkpoint, run_config([f"engine.nproc={now[0]}"]), now[0], now[1])


def test_a_pipeline_change_that_changes_the_replicas_is_refused():
    checkpoint = {**manifest(world_size=2), "pipeline_parallel": 2}  # one replica of two stages
    message = refusal(checkpoint, run_config(["engine.nproc=2"]), world_size=2)
    assert "2 data-parallel replicas where it had 1" in message, message


def test_a_tensor_parallel_change_that_changes_the_replicas_is_refused():
    checkpoint = {**manifest(world_size=2), "tensor_parallel": 2}
    message = refusal(checkpoint, run_config(["engine.nproc=2"]), world_size=2)
    assert "2 data-parallel replicas where it had 1" in message, message


def test_a_field_only_one_side_has_is_a_difference():
    # a checkpoint from an older toolkit lacks a field this run has (or the other way round): named, not skipped
    old = manifest()
    del old["config"]["model"]["activation"]
    assert "model.activation: checkpoint None, this run 'silu'" in refusal(old, run_config())
    newer = manifest()
    newer["config"]["optim"]["nesterov"] = True
    assert "optim.nesterov: checkpoint True, this run None" in refusal(newer, run_config())


def test_a_manifest_without_config_or_world_size_is_refused_not_crashed():
    assert "written by None processes" in refusal({"step": 5, "config": run_config()}, run_config())
    message = refusal({"step": 5, "world_size": 1}, run_config())
    assert message.startswith("checkpoint step_00000005 was written with a different config")
    assert "model.n_embd: checkpoint None, this run 32" in message



@pytest.mark.parametrize("written, now", [("torch", "fsdp"), ("fsdp", "torch")])
def test_ddp_and_fsdp_take_each_others_checkpoints(written, now):
    """The same steps from the same state: DDP's whole tensors resharded by FSDP, FSDP's shards assembled by DDP."""
    check_compatible({**manifest([f"engine.name={written}"], world_size=2), "engine": written},
                     run_config([f"engine.name={now}"]), 2)


@pytest.mark.parametrize("written, now", [("torch", "deepspeed"), ("deepspeed", "fsdp"), ("fsdp", "deepspeed")])
def test_deepspeeds_checkpoints_and_the_others_are_not_interchangeable(written, now):
    checkpoint = {**manifest([f"engine.name={written}"]), "engine": written}
    assert refusal(checkpoint, run_config([f"engine.name={now}"])) == (
        f"checkpoint step_00000020 was written by engine.name={written!r}; this run has {now!r}. Allowed: the same "
        "engine, or any of torch, fsdp for a checkpoint of one of them")
