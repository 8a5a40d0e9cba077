"""The forecast (toolkit.azure.forecast) against arithmetic nobody here wrote: Azure's published 157 TFLOPs per A100
for a 175B model, and Llama 3 405B's reported GPU-hours and interruptions; its memory advice; bad inputs refused
naming the field."""

from __future__ import annotations

import pytest

from toolkit.azure.errors import AzureError
from toolkit.azure.forecast import AZURE_PUBLISHED_MFU, ModelShape, Sourced, forecast
from toolkit.checkpoint.interval_advisor import GPU_HOURS_PER_FAILURE

GPT3 = ModelShape(175e9, layers=96, width=12288, sequence=1024, name="GPT-3 175B")


def test_azures_175b_figure_gives_the_step_time_of_the_arithmetic_by_hand():
    # Azure's published figure: 175B parameters, batch 16 per GPU, sequence 1024, 1,024 A100s, ~157 TFLOPs per GPU.
    # By hand: a step is 16 x 1024 tokens on each GPU, each token 6 N + 12 L d s FLOPs, at 157e12 FLOP/s per GPU.
    by_hand = 16 * 1024 * (6 * 175e9 + 12 * 96 * 12288 * 1024) / 157e12
    report = forecast(GPT3, Sourced(300e9, "given"), [("Standard_ND96asr_v4", 128)], mfu=AZURE_PUBLISHED_MFU,
                      batch_per_gpu=16)
    (row,) = report.rows
    assert row.gpus == 1024 and row.step_s == pytest.approx(by_hand, rel=1e-9)  # ~111 s
    assert row.tokens_per_s / row.gpus == pytest.approx(157e12 / (6 * 175e9 + 12 * 96 * 12288 * 1024), rel=1e-9)
    assert row.zero_stage == 3 and row.fits  # 175B fits 40 GiB A100s only with everything partitioned
    assert "157 TFLOPs per A100" in row.mfu.source and "312 TFLOPS dense" in row.peak_flops.source


def test_llama3_405b_lands_within_a_quarter_of_its_reported_gpu_hours_and_interruptions():
    # Dubey et al. 2024, "The Llama 3 Herd of Models": 405B parameters, 126 layers, width 16,384, sequence 8,192
    # (table 3); 15.6T pre-training tokens (section 3.1); 16,384 H100s at 400 TFLOPs per GPU
    # (table 4, 41% MFU); 419 unexpected interruptions in a 54-day snapshot (section 3.3.4). Meta's Llama 3.1 model
    # card: 30.84M H100 GPU-hours to train the 405B model, i.e. 78.4 days on 16,384 GPUs.
    llama = ModelShape(405e9, layers=126, width=16384, sequence=8192)
    report = forecast(llama, Sourced(15.6e12, "given"), [("Standard_ND96isr_H100_v5", 2048)],
                      mfu=Sourced(400 / 989, "table 4"))
    (row,) = report.rows
    reported_gpu_hours = 30.84e6
    assert row.gpu_hours == pytest.approx(reported_gpu_hours, rel=0.25)
    assert row.days == pytest.approx(reported_gpu_hours / 16384 / 24, rel=0.25)
    # the interruptions at the paper's own rate (the default MTBF comes from it: this checks the arithmetic that
    # carries the rate over the run, not the rate), over the reported duration
    assert row.interruptions == pytest.approx(419 * (reported_gpu_hours / 16384 / 24) / 54, rel=0.25)
    assert report.mtbf_gpu_hours.value == GPU_HOURS_PER_FAILURE and "419" in report.mtbf_gpu_hours.source


def test_every_input_names_where_it_came_from_and_a_price_given_replaces_the_table():
    report = forecast(ModelShape(7e9), Sourced(140e9, "Chinchilla"), [("Standard_ND96isr_H100_v5", 2)],
                      prices={"standard_nd96isr_h100_v5": Sourced(50.0, "given")})
    (row,) = report.rows
    assert row.price_per_node_hour == Sourced(50.0, "given")
    assert row.cost_usd == pytest.approx(row.wall_s / 3600 * 2 * 50.0)
    assert row.wall_s > row.train_s  # checkpoints and failures cost something
    text = report.text()
    for expected in ("Azure's published figure", "Llama 3's failure rate", "attention left out",
                     "an assumption: 10 minutes", "estimated: the model state per GPU", "price (Standard_ND96isr_H100_v5)"
                     ": 50.00 USD per node-hour, given"):
        assert expected in text, text


def test_the_lowest_zero_stage_that_fits_is_chosen_and_a_stage_that_does_not_fit_is_said():
    seven_b = ModelShape(7e9)
    (row,) = forecast(seven_b, Sourced(1e9, "given"), [("Standard_ND96isr_H100_v5", 1)]).rows
    assert row.fits and row.zero_stage in (1, 2, 3)
    (forced,) = forecast(seven_b, Sourced(1e9, "given"), [("Standard_ND96isr_H100_v5", 1)], zero_stage=0).rows
    assert not forced.fits and f"ZeRO-{row.zero_stage} fits" in forced.memory_advice


@pytest.mark.parametrize("call, problem", [
    (lambda: forecast(ModelShape(7e9), Sourced(1e9, ""), [("Standard_ND96asr_v5", 1)]),
     "--sku: 'Standard_ND96asr_v5' is not a known VM size; allowed: Standard_ND96asr_v4"),
    (lambda: forecast(ModelShape(7e9), Sourced(1e9, ""), [("Standard_NC6s_v3", 1)]),
     "--sku: 'Standard_NC6s_v3' has V100 GPUs, whose dense bf16 peak the datasheet table does not hold"),
    (lambda: forecast(ModelShape(7e9), Sourced(0, ""), [("Standard_ND96asr_v4", 1)]), "tokens: 0"),
    (lambda: forecast(ModelShape(7e9), Sourced(1e9, ""), [("Standard_ND96asr_v4", 0)]), "--nodes: 0"),
    (lambda: forecast(ModelShape(-1), Sourced(1e9, ""), [("Standard_ND96asr_v4", 1)]), "params: -1"),
    (lambda: forecast(ModelShape(7e9), Sourced(1e9, ""), [("Standard_ND96asr_v4", 1)], mfu=Sourced(1.5, "")),
     "--mfu: 1.5"),
    (lambda: forecast(ModelShape(7e9), Sourced(1e9, ""), [("local", 1)]), "'local' with --mfu run:RUN_DIR"),
    (lambda: forecast(ModelShape(20e12), Sourced(1e9, ""), [("Standard_NC24ads_A100_v4", 1)]),
     "fits none of them at any ZeRO stage: Standard_NC24ads_A100_v4 x 1: no stage fits: ZeRO-3 needs at least"),
])
def test_bad_input_is_refused_naming_the_field(call, problem):
    with pytest.raises(AzureError) as caught:
        call()
    assert problem in str(caught.value)


def test_the_throughput_comes_from_tflops_a_gpu_report_or_a_share_each_named():
    from toolkit.azure.forecast import throughput
    from toolkit.paths import PROJECT_ROOT

    mfu, peak = throughput(tflops=157, skus=["Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4"])
    assert mfu.value == pytest.approx(157 / 312) and mfu.source == "157 TFLOP/s per GPU, given" and peak is None
    with pytest.raises(AzureError, match="--tflops: 157 is not allowed; allowed: sizes of one GPU model"):
        throughput(tflops=157, skus=["Standard_ND96asr_v4", "Standard_ND96isr_H100_v5"])
    report = PROJECT_ROOT / "bench" / "results" / "2026-11-27T2205-h200" / "gpu_check.json"  # a committed report
    mfu, _ = throughput(f"gpu-report:{report}")
    assert mfu.value == pytest.approx(0.4069) and "NVIDIA H200, a 86M-parameter GPT, compiled" in mfu.source
    assert throughput(0.4)[0] == Sourced(0.4, "given") and throughput("0.35")[0] == Sourced(0.35, "given")
    assert throughput()[0] is AZURE_PUBLISHED_MFU


def test_an_mfu_measured_here_says_it_scales_by_the_ratio_of_the_peaks_on_a_gpu():
    here = Sourced(0.5, "measured by run r on this machine")
    report = forecast(ModelShape(1e9), Sourced(1e9, "given"), [("local", 1), ("Standard_ND96asr_v4", 1)], mfu=here,
                      measured_peak=Sourced(312e9, "measured peak"))
    local, gpu = report.rows
    assert local.mfu == here and local.tokens_per_s == pytest.approx(0.5 * 312e9 / 6e9)
    assert "scales the measured throughput by the ratio of the peaks (1,000x)" in gpu.mfu.source
    assert gpu.tokens_per_s == pytest.approx(1000 * 8 * local.tokens_per_s)  # 8 GPUs, each 1,000x the peak


def test_a_torch_engine_config_forecasts_its_state_whole_on_every_gpu_and_deepspeed_its_own_stage():
    from toolkit import config
    from toolkit.azure.forecast import shape_of_config

    assert shape_of_config(config.load("demo"))[3] == 0  # DDP: no partitioning, whatever would fit
    deepspeed = config.load("demo", ["engine.name=deepspeed", "engine.zero_stage=2"])
    shape, batch, precision, stage = shape_of_config(deepspeed)
    assert (batch, stage, shape.layers, shape.width, shape.sequence) == (16, 2, 4, 96, 128)


@pytest.mark.parametrize("call, problem", [
    (lambda t: t(tflops=400, skus=["Standard_ND96asr_v4"]), "--tflops: 400 is not allowed; allowed: at most the "
                                                             "GPU's peak, 312 TFLOP/s"),
    (lambda t: t("gpu-report:/nonexistent/gpu_check.json"), "--mfu: 'gpu-report:/nonexistent/gpu_check.json' cannot "
                                                            "be read"),
    (lambda t: t("run:/nonexistent/run"), "--mfu: 'run:/nonexistent/run' has none"),
])
def test_a_throughput_source_that_cannot_be_used_is_refused_naming_its_flag(call, problem):
    from toolkit.azure.forecast import throughput

    with pytest.raises(AzureError) as caught:
        call(throughput)
    assert problem in str(caught.value)
