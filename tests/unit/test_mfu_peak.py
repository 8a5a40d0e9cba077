"""The matmul peak MFU is computed against: a lower measurement never replaces a higher one."""

from __future__ import annotations


def test_the_mfu_peak_keeps_the_highest_measurement_of_this_machine(tmp_path, monkeypatch):
    from toolkit.train import flops

    monkeypatch.setattr(flops, "CACHE", tmp_path / "matmul_peak.json")
    assert flops.store_peak(4e10) == 4e10
    assert flops.store_peak(2e10) == 4e10, "a measurement under load replaced a better one"
    assert flops.cached_peak_record()["flops"] == 4e10
    assert flops.store_peak(5e10) == 5e10 and flops.cached_peak_record()["flops"] == 5e10


# --- the peak on a GPU: NVIDIA's datasheet figure for the device torch names ------------------------------------------

import pytest  # noqa: E402


@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989),  # H100 SXM5, as torch.cuda.get_device_name reports it
    ("NVIDIA H100 80GB HBM3", "fp16", 989),
    ("NVIDIA H100 PCIe", "bf16", 756),
    ("NVIDIA H100 NVL", "bf16", 835),
    ("NVIDIA H200", "bf16", 989),
    ("NVIDIA H200 NVL", "bf16", 835),
    ("NVIDIA GH200 480GB", "bf16", 989),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312),
    ("NVIDIA A100-SXM4-40GB", "fp16", 312),
    ("NVIDIA A100-PCIE-40GB", "bf16", 312),
    ("NVIDIA A100 80GB PCIe", "bf16", 312),
])
def test_the_bf16_dense_peak_of_a_known_gpu_comes_from_its_datasheet(name, precision, tflops):
    from toolkit.train import flops

    record = flops.datasheet_peak(name, precision)
    assert record is not None, f"{name!r} is in the table"
    assert record["flops"] == tflops * 1e12
    assert record["source"] == "datasheet" and record["device"] == name and record["precision"] == precision
    assert "NVIDIA" in record["reference"] and "datasheet" in record["reference"], record


@pytest.mark.parametrize("name, precision", [
    ("NVIDIA H100 80GB HBM3", "fp32"),  # the table is tensor-core half precision; fp32 is measured
    ("NVIDIA GeForce RTX 4090", "bf16"),
    ("Tesla V100-SXM2-16GB", "fp16"),
    ("NVIDIA H800", "bf16"),
    ("", "bf16"),
])
def test_a_gpu_or_precision_outside_the_table_has_no_datasheet_peak(name, precision):
    from toolkit.train import flops

    assert flops.datasheet_peak(name, precision) is None


def test_on_a_cpu_the_peak_is_this_machines_measured_one_and_says_so(tmp_path, monkeypatch):
    import torch

    from toolkit.train import flops

    monkeypatch.setattr(flops, "CACHE", tmp_path / "matmul_peak.json")
    flops.store_peak(3e10)
    for precision in ("fp32", "bf16"):
        record = flops.mfu_peak(torch.device("cpu"), precision)
        assert record["flops"] == 3e10 and record["source"] == "measured", record
        assert record["machine"] == flops.cached_peak_record()["machine"], "the cached record, as before"


@pytest.mark.parametrize("world, local_world, device, peaks", [
    (1, 1, "cuda", 1), (8, 8, "cuda", 8), (16, 8, "cuda", 16),  # a GPU is a device: DDP over 8 GPUs has 8 peaks
    (2, 2, "cpu", 1), (4, 2, "cpu", 2),  # CPU ranks share their machine's measured peak: a machine is a device
])
def test_mfu_divides_by_every_device_the_ranks_train_on(world, local_world, device, peaks):
    from toolkit.train import flops

    assert flops.mfu_devices(world, local_world, device) == peaks
