"""Model FLOPs utilisation (MFU): achieved training FLOPs over the peak of the device that trains.

Which peak (:func:`mfu_peak`, recorded with every run: status.json ``peak_flops`` and ``peak_source``, lineage.json
``mfu_peak``, its first status event):

* A GPU that NVIDIA's datasheets list, training in bf16 or fp16: the dense (no 2:4 sparsity) tensor-core peak for that
  precision from the datasheet (:data:`DATASHEET_PEAKS`): MFU as papers quote it (PaLM, appendix B), comparable
  across runs and machines.
* Any other GPU, or fp32 on a GPU: a matmul of the run's precision measured on that device as the run starts.
* A CPU: what a large float32 matmul reaches here with all cores, measured once and cached, because a datasheet number
  means nothing on a shared 2-core VM. ``bench/`` and ``doctor`` measure it again; the cache keeps the highest figure
  (see :func:`store_peak`), and every run records the one it used, so its MFU stays explainable whatever the cache
  holds later.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import time

import torch

from toolkit import paths
from toolkit.fsio import atomic_write_text
from toolkit.machine import cpu_model, usable_cores

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
    return f"{platform.node()}|{cpu_model()}|{os.cpu_count()}|torch {torch.__version__}"


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


# --- the peak of a GPU --------------------------------------------------------------------------------------------

# Dense bf16 (= fp16) tensor-core peak FLOP/s by GPU, from NVIDIA's datasheets, which print the figure with 2:4
# structured sparsity (twice the dense one) and say so in a footnote. Matched against the name torch reports
# (torch.cuda.get_device_name) in this order, so that a PCIe or NVL part is never taken for the SXM one:
#   (pattern, peak, the datasheet and what it prints)
DATASHEET_PEAKS: tuple[tuple[str, float, str], ...] = (
    (
        r"\bgh200\b",
        989e12,
        "NVIDIA GH200 Grace Hopper Superchip datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity, 989 dense",
    ),
    (
        r"\bh200\b.*\bnvl\b",
        835e12,
        "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL: BF16 Tensor Core 1,671 TFLOPS with sparsity, 835 dense",
    ),
    (
        r"\bh200\b",
        989e12,
        "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity, 989 dense",
    ),
    (
        r"\bh100\b.*\bpcie\b",
        756e12,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: BF16 Tensor Core 1,513 TFLOPS with sparsity, 756 dense",
    ),
    (
        r"\bh100\b.*\bnvl\b",
        835e12,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 NVL: BF16 Tensor Core 1,671 TFLOPS with sparsity, 835 dense",
    ),
    (
        r"\bh100\b",
        989e12,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 Tensor Core 1,979 TFLOPS with sparsity, 989 dense",
    ),
    (
        r"\ba100\b",
        312e12,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM and PCIe, 40 and 80 GB): BF16 Tensor Core "
        "312 TFLOPS dense (624 with sparsity)",
    ),
)
HALF_PRECISIONS = ("bf16", "fp16")  # what the table's tensor-core figure is for (fp16 and bf16 peaks are equal)


def datasheet_peak(device_name: str, precision: str) -> dict | None:
    """The dense tensor-core peak of the GPU torch calls ``device_name`` for ``precision`` (bf16 or fp16), as
    ``{"flops", "source": "datasheet", "device", "precision", "reference"}``; None for a GPU or precision the
    table does not hold (fp32: the peak is measured)."""
    if precision not in HALF_PRECISIONS:
        return None
    name = device_name.lower()
    for pattern, flops, reference in DATASHEET_PEAKS:
        if re.search(pattern, name):
            return {
                "flops": flops,
                "source": "datasheet",
                "device": device_name,
                "precision": precision,
                "reference": reference,
            }
    return None


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def measure_device_matmul_peak(device: torch.device, precision: str, n: int = 8192, seconds: float = 0.5) -> float:
    """Best FLOP/s of an n x n matmul of ``precision`` on the GPU ``device`` (2 n^3 FLOPs each), timed with CUDA
    events. fp32 runs as torch runs it (TF32 only where torch.backends.cuda.matmul.allow_tf32 is set).

    Its three matrices (1.2 GiB in fp32) would stand in the device's peak-memory statistics, which a run reports as
    its peak (torch.cuda.max_memory_allocated), so they are reset afterwards: call it before training allocates."""
    dtype = DTYPES[precision]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    with torch.cuda.device(device):
        torch.mm(a, b)  # cuBLAS picks and loads its kernel
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best, deadline = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            start.record()
            for _ in range(4):
                torch.mm(a, b)
            end.record()
            end.synchronize()
            best = max(best, 4 * 2 * n**3 / (start.elapsed_time(end) / 1e3))
    del a, b
    torch.cuda.empty_cache()  # the measurement's buffers are not the run's: leave the allocator as it was
    torch.cuda.reset_peak_memory_stats(device)
    return best


def mfu_devices(world_size: int, local_world_size: int, device_type: str) -> int:
    """How many peaks a run's MFU divides by: the work of all ranks over what all their devices could do. Each GPU
    is a device (a peak each); on CPUs the ranks of one machine share its cores, whose peak is the one measured, so
    a machine is a device. e.g. 16 ranks on 2 nodes of 8 GPUs: 16; 4 CPU ranks on 2 machines: 2."""
    if device_type == "cuda":
        return world_size
    return max(1, world_size // max(1, local_world_size))


def mfu_peak(device: torch.device, precision: str) -> dict:
    """The peak a run on ``device`` in ``precision`` computes MFU against, with where it comes from
    (``source``): a known GPU in bf16/fp16 the datasheet's, another GPU (or fp32) measured on the device now, a CPU
    this machine's cached measurement (:func:`cached_peak_record`). A measurement on a GPU resets its peak-memory
    statistics: call this before the run allocates anything there."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        record = datasheet_peak(name, precision)
        if record is not None:
            return record
        return {
            "flops": measure_device_matmul_peak(device, precision),
            "source": "measured",
            "device": name,
            "precision": precision,
            "measured": time.time(),
            "reference": f"a {precision} matmul measured on the device at the start (no datasheet figure for "
            f"{name!r} in {precision} in toolkit.train.flops.DATASHEET_PEAKS)",
        }
    return {**cached_peak_record(), "source": "measured"}
