"""Memory you can predict: real 2-process DeepSpeed runs measured against the estimator, the recommended setting
written by `trainbook estimate --write-config` trained as written, and the memory panel's button and comparison."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import cli

from toolkit import config as config_mod
from toolkit.resources import memory_model, zero_stages
from toolkit.rundir import RunDir
from widgets.resources import MemoryPanel

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def reference_baseline(private_cache):
    """Predictions from the reference baseline (an empty cache), but runs that find this machine's matmul peak
    cached, as every run after a machine's first does: measuring it on rank 0 would add ~50 MiB to rank 0's peak."""
    from toolkit.train import flops

    cache = Path(os.environ["TRAINBOOK_CACHE"])
    cache.mkdir(parents=True, exist_ok=True)
    (cache / flops.CACHE.name).write_text(json.dumps(flops.cached_peak_record()))

SHORT = ["train.max_steps=10", "train.log_every=5", "train.eval_every=10", "train.eval_batches=2",
         "checkpoint.at_end=false", "profile.enabled=false"]


def flags(*sets: str) -> list[str]:
    return [item for s in sets for item in ("--set", s)]


def test_the_written_zero2_setting_trains_within_the_stated_tolerance_on_every_rank(tmp_path):
    """`estimate --write-config` for a model big enough that its state and activations show next to the process's
    baseline (3.2M parameters: ~80 MiB of state a rank, ~35 MiB of activations) on 2 GPUs so small (48 MiB, 70% of
    it for model state) that ZeRO-2 is the lowest stage that fits (fp32: 16 -> 12 -> 10 bytes a parameter = 49, 37,
    31 MiB); the config trains as written on this CPU, and each rank's measured peak is within the tolerance."""
    out = tmp_path / "zero.yaml"
    model = ["model.n_layer=4", "model.n_embd=256", "model.block_size=64"]
    proc = cli("estimate", "--config", "tiny", *flags(*model), "--gpus", "2", "--gpu-memory", "0.047",
               "--write-config", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "predicted peak per rank" in proc.stdout and f"wrote {out}" in proc.stdout
    cfg = config_mod.load(out)
    assert (cfg.engine.name, cfg.engine.zero_stage, cfg.engine.nproc) == ("deepspeed", 2, 2)

    run_dir = tmp_path / "run"
    proc = cli("train", str(out), "--run-dir", str(run_dir), *flags(*SHORT))
    assert proc.returncode == 0, proc.stderr[-2000:]
    comparison = memory_model.compare_run(run_dir, device="cpu")
    assert len(comparison.measured_mib) == 2 and comparison.step == 10
    assert comparison.prediction.zero_stage == 2 and all(comparison.within_tolerance), comparison.table()
    # the guide's model state alone (10 bytes a parameter at ZeRO-2 x 2 in fp32) misses most of what a rank holds
    guide = zero_stages.estimate(comparison.prediction.params, "fp32", 2, 2).total_bytes / memory_model.MIB
    assert all(guide < 0.2 * m for m in comparison.measured_mib)

    proc = cli("estimate", "--run", str(run_dir))  # the same comparison from the command line
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == ["0", "1"] and all(r[-1] == "yes" for r in rows), proc.stdout

    panel = MemoryPanel(run_dir=run_dir).show()  # and next to the sliders
    assert panel.comparison.measured_mib == comparison.measured_mib
    assert "measured peak per rank" in panel.measured.value and panel.measured.value in panel.static_html()


def test_the_offload_setting_is_written_for_a_gpu_machine_and_refused_here(tmp_path):
    out = tmp_path / "big.yaml"
    proc = cli("estimate", "10B", "--gpus", "1", "--gpu-memory", "80", "--write-config", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "no stage fits" in proc.stdout and "Azure ML" in proc.stdout
    assert "--sku Standard_NC24ads_A100_v4" in proc.stdout  # one A100 80 GiB
    ds = json.loads((tmp_path / "big.ds_config.json").read_text())
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    proc = cli("train", str(out), "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2 and "offload_optimizer.device: 'cpu' moves state out of GPU memory" in proc.stderr
    assert not (tmp_path / "run").exists(), "refused before a run directory exists"


def test_the_panel_writes_its_recommended_setting(tmp_path):
    panel = MemoryPanel(model_size="1.3B", gpus=8, gpu_memory_gib=16, write_to=tmp_path / "rec.yaml").show()
    panel.write_button.click()
    cfg = config_mod.load(tmp_path / "rec.yaml")
    assert cfg.engine.zero_stage == panel.advice.stage and cfg.engine.nproc == 8 and "#d62728" not in panel.written.value
    assert str(tmp_path / "rec.yaml") in panel.written.value and panel.written.value in panel.static_html()
    panel.write_path.value = str(tmp_path / "rec.txt")
    panel.write_button.click()
    # beside the button, in the label the panel shows, and in place of the file it had written
    assert "config file: " in panel.written.value and "a .yaml or .yml file" in panel.written.value
    assert "--write-config" not in panel.written.value and "rec.yaml" not in panel.written.value
    panel.compare_button.click()
    assert "run dir: is empty; allowed: a run directory" in panel.measured.value
    panel.run_dir.value = str(tmp_path / "nowhere")
    panel.compare_button.click()
    assert "run dir: " in panel.measured.value and "is not a folder" in panel.measured.value
