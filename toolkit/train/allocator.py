"""The C allocator of a training process: keep the memory a step frees for the next step.

A training step allocates and frees the same tensors every step. glibc's defaults hand freed memory at the top of
the heap back to the OS once more than a few MiB are free, and serve blocks above a threshold that adapts from
128 KiB with mmap; either way the next step takes a page fault (and a page zeroed) for every 4 KiB it touches
again. On a 4-layer, 128-wide Llama that was ~35,000 faults a second and ~4% of the step time (bench_hf). PyTorch's
CUDA allocator keeps its blocks for the same reason; on CPU, raising two glibc thresholds does it:

    M_MMAP_THRESHOLD = 32 MiB   blocks up to 32 MiB come from the heap (glibc's largest allowed value, and it
                                turns off the threshold's adaptation)
    M_TRIM_THRESHOLD = 1 GiB    freed memory stays with the process until 1 GiB of it lies free at the top

The cost: the process's resident memory stays at its peak, which a training loop reaches every step anyway.
A user's own settings (MALLOC_*_ variables, GLIBC_TUNABLES for malloc) win: then nothing here changes.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 2**30


def users_settings() -> list[str]:
    """The environment variables through which the user already tuned glibc's allocator."""
    named = [k for k in os.environ if k.startswith("MALLOC_") and k.endswith("_")]
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        named.append("GLIBC_TUNABLES")
    return named


KEPT = "kept freed memory"


def keep_freed_memory() -> str:
    """Raise the two thresholds in this process; say which settings are in force (for the run's lineage)."""
    if users := users_settings():
        return "the user's: " + " ".join(users)
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt if sys.platform.startswith("linux") else None
    except (OSError, AttributeError):  # another C library (musl has no mallopt)
        mallopt = None
    if mallopt and mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD):
        return KEPT
    return "the C library's defaults"
