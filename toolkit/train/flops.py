"""Model FLOPs utilisation (MFU): achieved training FLOPs over a peak measured on this machine.

The peak is what a large float32 matmul reaches here with all cores, measured once and cached, because a
datasheet number means nothing on a shared 2-core VM. ``bench/`` re-measures it in every run.
"""

from __future__ import annotations

import json
import os
import platform
import time

import torch

from toolkit import paths

CACHE = paths.cache_dir() / "matmul_peak.json"


def measure_matmul_peak(n: int = 2048, seconds: float = 1.0, threads: int | None = None) -> float:
    """Best-of-several FLOP/s of an n x n float32 matmul (2 n^3 FLOPs each)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads or os.cpu_count() or 1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.mm(a, b)  # warm up the BLAS thread pool
        best, deadline = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - t0))
        return best
    finally:
        torch.set_num_threads(old)


def _machine_key() -> str:
    return f"{platform.node()}|{platform.processor()}|{os.cpu_count()}|torch {torch.__version__}"


def cached_peak() -> float:
    """The measured matmul peak for this machine, measuring (about 1 s) and caching it on first use."""
    try:
        record = json.loads(CACHE.read_text())
        if record.get("machine") == _machine_key():
            return float(record["flops"])
    except (OSError, ValueError, KeyError):
        pass
    return store_peak(measure_matmul_peak())


def store_peak(flops: float) -> float:
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    tmp = CACHE.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"machine": _machine_key(), "flops": flops, "measured": time.time()}))
    os.replace(tmp, CACHE)
    return flops
