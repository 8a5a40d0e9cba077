"""The matmul peak MFU is computed against: a lower measurement never replaces a higher one."""

from __future__ import annotations


def test_the_mfu_peak_keeps_the_highest_measurement_of_this_machine(tmp_path, monkeypatch):
    from toolkit.train import flops

    monkeypatch.setattr(flops, "CACHE", tmp_path / "matmul_peak.json")
    assert flops.store_peak(4e10) == 4e10
    assert flops.store_peak(2e10) == 4e10, "a measurement under load replaced a better one"
    assert flops.cached_peak_record()["flops"] == 4e10
    assert flops.store_peak(5e10) == 5e10 and flops.cached_peak_record()["flops"] == 5e10
