"""Model FLOPs utilisation (MFU): achieved training FLOPs over a peak measured on this machine.

The peak is what a large float32 matmul reaches here with all cores, measured once and cached, because a
datasheet number means nothing on a shared 2-core VM. ``bench/`` and ``doctor`` measure it again; the cache keeps
the highest figure (see :func:`store_peak`), and every run records the one it used (status.json, lineage.json
and its first status event), so its MFU stays explainable whatever the cache holds later.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import time

import torch

from toolkit import paths
from toolkit.fsio import atomic_write_text
from toolkit.resources.machine import usable_cores

CACHE = paths.cache_dir() / "matmul_peak.json"


def measure_matmul_peak(n: int = 2048, seconds: float = 1.0, threads: int | None = None) -> float:
    """Best-of-several FLOP/s of an n x n float32 matmul (2 n^3 FLOPs each)."""
    old, wanted = torch.get_num_threads(), threads or usable_cores()
    if wanted != old:  # set_num_threads also turns MKL's dynamic threading off for the rest of the process
        torch.set_num_threads(wanted)
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
        if wanted != old:
            torch.set_num_threads(old)


def _machine_key() -> str:
    return f"{platform.node()}|{platform.processor()}|{os.cpu_count()}|torch {torch.__version__}"


def cached_peak_record() -> dict:
    """The matmul peak for this machine, with where it comes from: {"flops", "measured" (time), "machine"};
    measured (about 1 s) and cached on first use."""
    record = _read_cache()
    if record is None:
        flops = store_peak(measure_matmul_peak())
        # read back: another process may have stored a higher figure meanwhile; unreadable, ours
        record = _read_cache() or {"flops": flops, "measured": time.time(), "machine": _machine_key()}
    return record


def _read_cache() -> dict | None:
    """This machine's cached record, or None (no cache, another machine's, or unreadable)."""
    try:
        record = json.loads(CACHE.read_text())
        if record.get("machine") == _machine_key():
            return {"flops": float(record["flops"]), "measured": record.get("measured"), "machine": record["machine"]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    return None


def store_peak(flops: float) -> float:
    """Record a measurement; returns the peak MFU is computed against from now on: the higher of ``flops`` and
    the figure already cached for this machine.

    Why the maximum: the peak stands for what this machine can do, and a measurement can only come out below
    that, never above (other work on a shared VM, a throttled or busy core, a cold BLAS pool), so the highest
    figure seen is the best estimate. Replacing it with the latest one let a `doctor` run under load halve the
    denominator and double the MFU of every run after it. The max is kept per machine key (host, CPU, core count,
    torch version): a new machine or a new torch, whose BLAS may be slower, starts afresh."""
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    # read-compare-write under an exclusive lock: two writers (a doctor, a bench, runs starting) each reading the
    # old figure and writing their own would let the lower one land last
    fd = os.open(CACHE.with_name(CACHE.name + ".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        cached = _read_cache()
        if cached is not None and cached["flops"] >= flops:
            return cached["flops"]
        atomic_write_text(CACHE, json.dumps({"machine": _machine_key(), "flops": flops, "measured": time.time()}))
        return flops
    finally:
        os.close(fd)  # releases the lock
