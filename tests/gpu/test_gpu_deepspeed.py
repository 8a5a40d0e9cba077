"""DeepSpeed on one GPU, one rank over NCCL (NCCL refuses two ranks on one GPU): ZeRO-2 and ZeRO-3 train in bf16, the
predicted peak memory per ZeRO stage holds against the measured one (torch.cuda.max_memory_allocated), and ZeRO-Offload
moves the optimizer state to the host, where DeepSpeed's CPU Adam (built here, its build time kept) updates it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gpu_helpers import (BF16, GPT2_SMALL, PROJECT, QUIET, assert_learned, cli, lineage_device, log_tail,
                         n_params, peak_memory_mib, sets, train)

pytestmark = pytest.mark.usefixtures("deepspeed_version")

# GPT-2 small's shape in bf16 for 12 steps: model state (~20 bytes a parameter, 1.7 GB) and activations (~2.4 GB)
# large enough that the memory prediction is about them rather than about fixed costs
ZERO_STEPS = 12


def zero_args(stage: int) -> tuple[str, ...]:
    return ("tiny", "--engine", "deepspeed", *GPT2_SMALL, *BF16, *QUIET,
            *sets(f"engine.zero_stage={stage}", f"train.max_steps={ZERO_STEPS}", "train.log_every=2",
                  "optim.warmup_steps=2"))


@pytest.fixture(scope="module")
def offload_run(deepspeed_version, tmp_path_factory, figure_sink):
    """ZeRO-2 with the optimizer state offloaded to the CPU (a DeepSpeed file, as users bring one). DeepSpeed's CPU
    Adam is built first, in a fresh extensions folder, and timed: the cost a first offload run pays; the run then
    loads that build."""
    folder = tmp_path_factory.mktemp("offload")
    extensions = folder / "torch_extensions"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    build = ("import time, toolkit; from toolkit.third_party import import_deepspeed; import_deepspeed(); "
             "from deepspeed.ops.op_builder import CPUAdamBuilder; t = time.perf_counter(); CPUAdamBuilder().load(); "
             "print(time.perf_counter() - t)")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", build], capture_output=True, text=True, cwd=PROJECT, env=env,
                          timeout=600)
    assert proc.returncode == 0, f"DeepSpeed's CPU Adam did not build:\n{proc.stderr[-3000:]}"
    figure_sink["cpu_adam_build_s"] = round(float(proc.stdout.split()[-1]), 1)
    figure_sink["cpu_adam_build_and_import_s"] = round(time.perf_counter() - start, 1)
    ds_file = folder / "ds_offload.json"
    ds_file.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu",
                                                                                            "pin_memory": True}}}))
    args = ("tiny", "--deepspeed", str(ds_file), *GPT2_SMALL, *BF16, *QUIET,
            *sets(f"train.max_steps={ZERO_STEPS}", "train.log_every=2", "optim.warmup_steps=2"))
    proc, run = train(folder / "run", *args, env=env)
    assert proc.returncode == 0, f"{proc.stderr[-2000:]}\n--- train.log ---\n{log_tail(run)}"
    return run


@pytest.fixture(scope="module")
def figure_sink():
    """Figures a module-scoped fixture measured, for the test that reports them (``figure`` is per test)."""
    return {}


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_trains_in_bf16_on_one_rank_over_nccl(gpu_runs, cuda_name, stage, figure):
    run = gpu_runs(*zero_args(stage))
    events = assert_learned(run, drop=0.5)
    device = lineage_device(run)
    assert (device["type"], device["name"], device["precision"], device["backend"]) == \
        ("cuda", cuda_name, "bf16", "nccl"), device
    handed = json.loads(run.deepspeed_config_path.read_text())
    assert handed["zero_optimization"]["stage"] == stage and handed["bf16"]["enabled"] is True, handed
    assert all(len(e["peak_memory_mb"]) == 1 and e["peak_memory_mb"][0] > 0 for e in events)
    assert run.read_status()["peak_source"] in ("datasheet", "measured")
    figure(f"zero{stage}_bf16_tokens_per_s", round(events[-1]["tokens_per_s"]))
    figure(f"zero{stage}_bf16_mfu", events[-1]["mfu"])
    figure(f"zero{stage}_adam", "torch AdamW" if handed["optimizer"]["params"].get("torch_adam") else "FusedAdam")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_the_predicted_peak_memory_of_each_zero_stage_holds_on_the_gpu(gpu_runs, stage, figure):
    """toolkit.resources.memory_model's prediction for the run's own config against its measured peak
    (max_memory_allocated on the one rank): the stated accuracy, ±15%, is the goal."""
    from toolkit.resources.memory_model import TOLERANCE, compare_run

    run = gpu_runs(*zero_args(stage))
    comparison = compare_run(run.path)
    assert comparison.prediction.device == "cuda"
    (ratio,) = comparison.ratios
    figure(f"zero{stage}_peak_measured_mib", comparison.measured_mib[0])
    figure(f"zero{stage}_peak_predicted_mib", round(comparison.prediction.per_rank_mib[0], 1))
    figure(f"zero{stage}_peak_measured_over_predicted", round(ratio, 3))
    if stage == 2:  # the command a user runs gives the same comparison
        shown = cli("estimate", "--run", str(run.path))
        assert shown.returncode == 0 and "measured (last train event" in shown.stdout, shown.stdout + shown.stderr
    assert abs(ratio - 1) <= TOLERANCE, (
        f"goal missed: ZeRO-{stage} measured {comparison.measured_mib[0]:,.0f} MiB against a prediction of "
        f"{comparison.prediction.per_rank_mib[0]:,.0f} (ratio {ratio:.3f}, allowed ±{TOLERANCE:.0%}):\n"
        f"{comparison.prediction.table()}\n{comparison.table()}")


def test_zero_offload_moves_the_optimizer_state_to_the_host(gpu_runs, offload_run, figure_sink, figure):
    """The offloaded run trains, DeepSpeed stepped with its CPU Adam (no fallback to torch's AdamW), and its GPU peak
    is below the same run's without offload by most of the optimizer state it moved (fp32 master weights and Adam's
    moments, 12 bytes a parameter): at least half of that."""
    assert_learned(offload_run, drop=0.5)
    handed = json.loads(offload_run.deepspeed_config_path.read_text())
    assert handed["zero_optimization"]["offload_optimizer"]["device"] == "cpu", handed
    assert "torch_adam" not in handed["optimizer"]["params"], "offload steps with DeepSpeed's CPU Adam"
    assert "not FusedAdam" not in log_tail(offload_run, 10**6)
    (offloaded,) = peak_memory_mib(offload_run)
    (resident,) = peak_memory_mib(gpu_runs(*zero_args(2)))
    moved_mib = 12 * n_params(offload_run) / 2**20
    for name, value in figure_sink.items():
        figure(name, value)
    figure("zero2_offload_peak_mib", offloaded)
    figure("zero2_peak_mib", resident)
    from toolkit.resources.memory_model import compare_run

    figure("zero2_offload_peak_measured_over_predicted", round(compare_run(offload_run.path).ratios[0], 3))
    assert offloaded <= resident - moved_mib / 2, (
        f"offload left {offloaded:,.0f} MiB on the GPU against {resident:,.0f} without it; the optimizer state is "
        f"{moved_mib:,.0f} MiB")
