"""The matmul peak MFU is computed against, written by several processes at once (toolkit.train.flops)."""

from __future__ import annotations


def _store_each(values: list[float]) -> None:
    from toolkit.train import flops

    for value in values:
        flops.store_peak(value)


def test_concurrent_writers_never_lose_the_highest_measurement(tmp_path, monkeypatch):
    """Each writer reads, compares and writes: unlocked, a writer that read before another stored a higher figure
    overwrote it with its lower one. Processes (a doctor, a bench, several runs' first starts) share the cache."""
    import multiprocessing

    from toolkit.train import flops

    monkeypatch.setattr(flops, "CACHE", tmp_path / "matmul_peak.json")  # inherited by the forked writers
    writers = 4
    values = [[1e10 + (i * writers + w) * 1e6 for i in range(80)] for w in range(writers)]
    highest = max(max(v) for v in values)
    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=_store_each, args=(v,)) for v in values]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0, proc.exitcode
    assert flops.cached_peak_record()["flops"] == highest
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["matmul_peak.json"], \
        "a writer left a temporary file"
