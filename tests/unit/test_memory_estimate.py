"""The run-level memory predictor: its arithmetic per engine, stage, precision, accumulation and checkpointing, the
baseline it adds, the recommended setting written as a config, and bad input refused naming the field. No training
runs here (tests/e2e/test_memory.py compares with real ones)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from toolkit import config as config_mod
from toolkit.config import ConfigError
from toolkit.azure import recommended_config
from toolkit.resources import memory_baseline, memory_model, zero_stages
from toolkit.events import StatusEvent, TrainEvent
from toolkit.rundir import RunDir
from toolkit.deepspeed_config import DeepSpeedConfigError, check
from toolkit.train.models.gpt import GPT

MIB = 2**20
BENCH = ["model.n_layer=6", "model.n_embd=512", "model.n_head=8", "model.block_size=128", "train.batch_size=8"]


def cfg_of(*sets: str) -> config_mod.Config:
    return config_mod.load("tiny", [*BENCH, *sets])


def state_per_param(prediction) -> float:
    """Bytes per parameter of the terms that scale with the parameter count."""
    return sum(t.bytes for t in prediction.terms if t.per_param) / prediction.params


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBOOK_CACHE", str(tmp_path / "cache"))  # no measured baseline: the reference figures


# --- activations -------------------------------------------------------------------------------------------------

def saved_by_autograd(model, idx) -> int:
    """Bytes of the distinct tensors autograd keeps from forward for backward (the weights excluded)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(idx, idx)
    return sum(seen.values())


@pytest.mark.parametrize("layers, width", [(1, 64), (3, 128)])
def test_the_activation_formula_counts_what_autograd_keeps(layers, width):
    cfg = config_mod.load("tiny", [f"model.n_layer={layers}", f"model.n_embd={width}", "model.n_head=4",
                                   "model.block_size=32", "train.batch_size=4"])
    predicted = memory_model.activation_bytes(cfg.model, cfg.train.batch_size)
    measured = saved_by_autograd(GPT(cfg.model), torch.randint(0, 256, (4, 32)))
    # the formula leaves out the per-token statistics (layer norm mean/rstd, attention logsumexp): under 2%
    assert predicted == pytest.approx(measured, rel=0.02)
    B, T, C, L = 4, 32, width, layers
    assert predicted == (16 * L + 2 + 256 / C) * B * T * C * 4


def test_checkpointing_keeps_each_blocks_input_and_one_block():
    cfg = cfg_of()
    B, T, C, L = 8, 128, 512, 6
    assert memory_model.activation_bytes(cfg.model, 8) == (16 * L + 2 + 256 / C) * B * T * C * 4
    ckpt = cfg_of("model.activation_checkpointing=true")
    assert memory_model.activation_bytes(ckpt.model, 8) == (L + 16 + 2 + 256 / C) * B * T * C * 4
    assert memory_model.activation_bytes(cfg.model, 8, bytes_per_element=2) == memory_model.activation_bytes(cfg.model, 8) / 2


def test_models_without_a_formula_say_so():
    cfg = config_mod.load("tiny", ["model.name=digits_mlp", "data.dataset=digits"])
    assert memory_model.activation_bytes(cfg.model, 8) is None
    prediction = memory_model.predict_run(cfg, device="cpu")
    assert any("activations" in note and "digits_mlp" in note for note in prediction.notes)


# --- model state per engine and stage (CPU, fp32) --------------------------------------------------------------

@pytest.mark.parametrize("sets, per_param", [
    (["engine.name=torch", "engine.nproc=1"], 16),  # weights, gradients, Adam's two moments
    (["engine.name=torch", "engine.nproc=2"], 20),  # + DDP's all-reduce buckets, a copy of every gradient
    (["engine.name=deepspeed", "engine.nproc=2", "engine.zero_stage=0"], 20),  # + DeepSpeed's flat all-reduce copy
    (["engine.name=deepspeed", "engine.nproc=2", "engine.zero_stage=1"], 16 + 20 / 2),
    (["engine.name=deepspeed", "engine.nproc=2", "engine.zero_stage=2"], 16 + 20 / 2),
    (["engine.name=deepspeed", "engine.nproc=4", "engine.zero_stage=2"], 16 + 20 / 4),
    (["engine.name=deepspeed", "engine.nproc=2", "engine.zero_stage=3"], 24 + 20 / 2),
    (["engine.name=fsdp", "engine.nproc=1"], 16),  # weights, gradients and moments, nothing split, nothing gathered
    (["engine.name=fsdp", "engine.nproc=2"], 16 / 2),  # each rank 1/2 of them (the gathered blocks: not per Ψ)
    (["engine.name=fsdp", "engine.nproc=4"], 16 / 4),
])
def test_cpu_model_state_per_stage(sets, per_param):
    prediction = memory_model.predict_run(cfg_of(*sets), device="cpu")
    assert state_per_param(prediction) == pytest.approx(per_param)
    assert len(prediction.per_rank_mib) == prediction.nproc


def test_the_guide_formula_alone_would_say_zero_saves_memory_on_cpu_and_it_does_not():
    """The correction in one line: at 2 processes the guide's fp32 stages fall 16 -> 12 -> 10 -> 8 bytes a
    parameter; on CPU DeepSpeed's flat copies and buckets make stages 1-3 cost more than stage 0."""
    psi = zero_stages.model_params(cfg_of())
    guide = [zero_stages.estimate(psi, "fp32", s, 2).total_bytes / psi for s in zero_stages.STAGES]
    assert guide == [16, 12, 10, 8]
    cpu = [state_per_param(memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2", f"engine.zero_stage={s}"),
                                          device="cpu")) for s in zero_stages.STAGES]
    assert cpu[0] < cpu[1] == cpu[2] < cpu[3]


def test_buckets_are_capped_at_their_configured_size(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1_000_000}}))
    small = memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2", f"engine.deepspeed_config={ds}"),
                           device="cpu")
    default = memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2", "engine.zero_stage=2"), device="cpu")
    bucket = next(t for t in small.terms if "bucket" in t.name)
    assert bucket.bytes == 4 * 1_000_000 and not bucket.per_param
    assert sum(default.per_rank_mib) > sum(small.per_rank_mib)


def test_accumulation_keeps_only_zeros_gradient_partition_and_checkpointing_lowers_the_peak():
    base = memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2"), device="cpu")
    accum = memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2", "train.grad_accum_steps=4"), device="cpu")
    ckpt = memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2", "model.activation_checkpointing=true"),
                          device="cpu")
    assert accum.per_rank_mib == base.per_rank_mib  # micro-batches run one after another, gradients add in place
    zero2 = [memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2", "engine.zero_stage=2",
                                   f"train.grad_accum_steps={k}"), device="cpu") for k in (1, 4)]
    assert state_per_param(zero2[1]) - state_per_param(zero2[0]) == 4 / 2  # the partition kept between micro-steps
    saved = (16 - 1) * 6 * 8 * 128 * 512 * 4 - 16 * 8 * 128 * 512 * 4  # (L - 1) blocks' activations less
    assert sum(base.per_rank_mib) - sum(ckpt.per_rank_mib) == pytest.approx(2 * saved / MIB)


def test_bf16_halves_deepspeeds_weights_and_activations_not_the_fp32_optimizer():
    fp32 = memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2", "engine.zero_stage=1"), device="cpu")
    bf16 = memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2", "engine.zero_stage=1",
                                 "engine.precision=bf16"), device="cpu")
    assert state_per_param(bf16) < state_per_param(fp32)
    adam = [t for p in (fp32, bf16) for t in p.terms if "Adam" in t.name]
    assert adam[0].bytes == adam[1].bytes, "the moments stay fp32"


def test_each_rank_starts_from_the_baseline_of_its_engine():
    prediction = memory_model.predict_run(cfg_of("engine.name=deepspeed", "engine.nproc=2"), device="cpu")
    rank0, other = memory_baseline.REFERENCE_BASELINE_MIB["deepspeed"]
    assert prediction.baseline_mib == (rank0, other) and "reference" in prediction.baseline_source
    state = sum(t.bytes for t in prediction.terms) / MIB
    assert prediction.per_rank_mib == pytest.approx([rank0 + state, other + state])


def test_a_measured_baseline_for_this_machine_replaces_the_reference():
    memory_baseline.store_baseline("torch", [400.0, 390.0])
    prediction = memory_model.predict_run(cfg_of("engine.nproc=2"), device="cpu")
    assert prediction.baseline_mib == (400.0, 390.0) and "measured" in prediction.baseline_source
    # another machine's (or another torch's) figure is not this machine's
    cache = memory_baseline.baseline_cache_path()
    record = json.loads(cache.read_text())
    record["machine"] = "elsewhere"
    cache.write_text(json.dumps(record))
    assert memory_model.predict_run(cfg_of("engine.nproc=2"), device="cpu").baseline_mib == memory_baseline.REFERENCE_BASELINE_MIB["torch"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_on_a_gpu_the_guide_formula_plus_activations_and_buckets(stage):
    """One reduce bucket at every stage: ZeRO-3 allocates one per communication dtype too (stage3.py's ipg_buckets),
    which the H200 check of 2026-11-27 confirmed (ZeRO-3 measured 164 MiB over ZeRO-2, not a second 954 MiB)."""
    cfg = cfg_of("engine.name=deepspeed", "engine.nproc=8", f"engine.zero_stage={stage}", "engine.precision=bf16")
    prediction = memory_model.predict_run(cfg, device="cuda")
    psi = prediction.params
    guide = zero_stages.estimate(psi, "bf16", stage, 8).total_bytes
    activations = memory_model.activation_bytes(cfg.model, 8, bytes_per_element=2)
    bucket = 5e8 * 2  # DeepSpeed's reduce bucket, allocated whole by the CUDA caching allocator
    assert prediction.baseline_mib == (0.0,) * 8  # max_memory_allocated counts tensors only
    assert prediction.per_rank_mib[0] * MIB == pytest.approx(guide + activations + bucket)


# --- comparison with a finished run ---------------------------------------------------------------------------

def fake_run(tmp_path, cfg, peaks, n_params=None):
    run = RunDir.create(tmp_path / "run", cfg)
    run.append_event(StatusEvent(state="running", n_params=n_params or zero_stages.model_params(cfg)))
    for step, peak in enumerate(peaks, 1):
        run.append_event(TrainEvent(step=step, loss=1.0, lr=1e-3, tokens_per_s=1.0, data_wait_pct=0.0, mfu=0.0,
                                    elapsed_s=1.0, peak_memory_mb=peak))
    return run


def test_a_run_is_compared_rank_by_rank_with_its_last_peak(tmp_path):
    cfg = cfg_of("engine.name=deepspeed", "engine.nproc=2")
    predicted = memory_model.predict_run(cfg, device="cpu").per_rank_mib
    run = fake_run(tmp_path, cfg, [[100.0, 100.0], [predicted[0] * 1.1, predicted[1] * 0.8]])
    comparison = memory_model.compare_run(run.path, device="cpu")
    assert comparison.measured_mib == pytest.approx([predicted[0] * 1.1, predicted[1] * 0.8])
    assert comparison.ratios == pytest.approx([1.1, 0.8])
    assert comparison.within_tolerance == [True, False]
    table = comparison.table()
    assert "rank" in table and "1.10" in table and "0.80" in table and "15%" in table


def test_the_parameter_count_comes_from_the_run_not_its_code(tmp_path, monkeypatch):
    """A copied run directory is data: its model is never built (a custom factory would run its code)."""
    cfg = cfg_of()
    run = fake_run(tmp_path, cfg, [[500.0]], n_params=123_456)
    monkeypatch.setattr(memory_model, "model_params", lambda cfg: pytest.fail("built the run's model"))
    assert memory_model.compare_run(run.path, device="cpu").prediction.params == 123_456


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "missing", "run_dir: '{tmp}/missing' is not a folder; allowed: a run directory"),
    (lambda tmp: fake_run(tmp, cfg_of(), []).path, "run_dir: '{tmp}/run' has no train event with peak_memory_mb "
                                                    "yet; allowed: a run that has logged at least one step"),
])
def test_a_run_without_a_measurement_is_refused_naming_it(tmp_path, make, message):
    path = make(tmp_path)
    with pytest.raises((ConfigError, FileNotFoundError), match="^" + re.escape(message.format(tmp=tmp_path))):
        memory_model.compare_run(path, device="cpu")


# --- the recommended setting as a config ----------------------------------------------------------------------

def test_the_written_config_loads_and_holds_the_recommended_stage(tmp_path):
    written = recommended_config.write_recommended_config(tmp_path / "rec.yaml", base="tiny", gpus=2, gpu_memory_gib=80,
                                          precision="fp32")
    cfg = config_mod.load(written.path)
    assert (cfg.engine.name, cfg.engine.zero_stage, cfg.engine.nproc, cfg.engine.precision) == \
        ("deepspeed", written.advice.stage, 2, "fp32")
    assert written.advice.stage == 0 and written.deepspeed_config is None
    assert cfg.model == config_mod.load("tiny").model, "the base config's model is kept"
    assert "ZeRO-0" in written.summary() and str(written.path) in written.summary()


def test_a_bare_count_gets_a_gpt_of_about_that_size(tmp_path):
    written = recommended_config.write_recommended_config(tmp_path / "7b.yaml", params=7e9, gpus=8, gpu_memory_gib=80)
    cfg = config_mod.load(written.path)
    assert cfg.engine.zero_stage == 1 == written.advice.stage  # 7B on 8 x 80 GiB: the guide's ZeRO-1
    assert 5e9 < zero_stages.model_params(cfg) < 9e9 and cfg.engine.precision == "bf16" and cfg.engine.nproc == 8
    assert "replace the model section" in written.summary()


def test_when_no_stage_fits_the_config_offloads_for_a_gpu_machine(tmp_path):
    written = recommended_config.write_recommended_config(tmp_path / "big.yaml", params=10e9, gpus=1, gpu_memory_gib=80)
    assert written.advice.stage is None and written.deepspeed_config is not None
    ds = json.loads(written.deepspeed_config.read_text())
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert "offload_param" not in ds["zero_optimization"], "2 bytes x 12.6e9 of half weights and gradients fit"
    cfg = config_mod.load(written.path)
    assert cfg.engine.zero_stage == 3 and cfg.engine.deepspeed["zero_optimization"]["offload_optimizer"]
    assert "GPU" in written.summary() and "Azure ML" in written.summary()
    with pytest.raises(DeepSpeedConfigError, match="offload_optimizer.device: 'cpu' moves state out of GPU memory"):
        check(cfg, 1, cuda=False)  # what a launch on this CPU-only machine says


def test_offload_of_the_parameters_too_when_the_optimizer_alone_is_not_enough(tmp_path):
    written = recommended_config.write_recommended_config(tmp_path / "huge.yaml", params=50e9, gpus=1, gpu_memory_gib=80)
    ds = json.loads(written.deepspeed_config.read_text())
    assert ds["zero_optimization"]["offload_param"]["device"] == "cpu"  # ZeRO-Infinity: 2 bytes x 50e9 > 56 GiB


def test_a_setting_that_would_not_load_is_refused_before_a_file_is_written(tmp_path):
    with pytest.raises(ConfigError, match=r"^engine.nproc: 2048 is out of range; allowed: >= 1 and <= 1024$"):
        recommended_config.write_recommended_config(tmp_path / "x.yaml", params=1e9, gpus=2048)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("call, message", [
    (lambda tmp: memory_model.predict_run(cfg_of(), device="tpu"), "device: 'tpu' is not allowed; allowed: cpu, cuda"),
    (lambda tmp: memory_model.predict_run(cfg_of("engine.precision=fp16"), device="cpu"),
     "engine.precision: 'fp16' is not allowed on a CPU; allowed: fp32 or bf16 (fp16 needs a GPU)"),
    (lambda tmp: recommended_config.write_recommended_config(tmp / "x.txt", params=1e9), "--write-config: '{tmp}/x.txt' is not "
                                                                         "allowed; allowed: a .yaml or .yml file"),
    (lambda tmp: recommended_config.write_recommended_config(tmp, params=1e9), "--write-config: '{tmp}' is a folder"),
    (lambda tmp: recommended_config.write_recommended_config(tmp / "x.yaml"), "params: missing; allowed: a parameter count"),
    (lambda tmp: recommended_config.write_recommended_config(tmp / "x.yaml", params=1e9, base="tiny"), "params: 1000000000.0 is "
                                                                                        "not allowed with a base"),
    (lambda tmp: recommended_config.write_recommended_config(tmp / "x.yaml", params=1e12), "params: 1000000000000.0 is too large "
                                                                            "for the built-in gpt"),
    (lambda tmp: recommended_config.write_recommended_config(tmp / "x.yaml", params=1e9, gpus=0), "gpus: 0 is not allowed"),
])
def test_bad_input_is_refused_naming_the_field(tmp_path, call, message):
    with pytest.raises(ConfigError, match="^" + re.escape(message.format(tmp=tmp_path))):
        call(tmp_path)


def test_a_split_base_config_is_written_for_the_torch_engine_with_its_layout(tmp_path):
    # tensor and pipeline parallelism run on the torch engine, which has no ZeRO: the split as given, on the GPUs
    staged = ["engine.pipeline_parallel=2", "train.grad_accum_steps=2"]
    written = recommended_config.write_recommended_config(tmp_path / "pp.yaml", base="tiny", overrides=staged, gpus=4,
                                                          gpu_memory_gib=80)
    cfg = config_mod.load(tmp_path / "pp.yaml")
    assert (cfg.engine.name, cfg.engine.nproc, cfg.engine.pipeline_parallel, cfg.engine.zero_stage) == ("torch", 4, 2, 0)
    assert written.summary().startswith(f"wrote {tmp_path / 'pp.yaml'}: engine.name=torch, engine.zero_stage=0")
    assert "2 data-parallel replica(s)" in written.summary()
    with pytest.raises(config_mod.ConfigError, match=r"engine.pipeline_parallel: 2 leaves model state of 16 Ψ/2 = "):
        recommended_config.write_recommended_config(tmp_path / "no.yaml", base="tiny", overrides=staged, gpus=4,
                                                    gpu_memory_gib=0.0001)
    assert not (tmp_path / "no.yaml").exists()
