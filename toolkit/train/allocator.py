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
A threshold the user set (MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, or in GLIBC_TUNABLES) is theirs: it
is left as they set it, and the lineage says so.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
# threshold -> (mallopt parameter, our value, the environment variable and the tunable a user sets it with)
THRESHOLDS = {
    "mmap": (M_MMAP_THRESHOLD, 32 * 2**20, "MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
    "trim": (M_TRIM_THRESHOLD, 2**30, "MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
}
KEPT = "kept freed memory"


def users_setting(threshold: str) -> str | None:
    """How the user already set this threshold (the variable or the tunable's name), or None."""
    _, _, variable, tunable = THRESHOLDS[threshold]
    if os.environ.get(variable):
        return variable
    return tunable if tunable in os.environ.get("GLIBC_TUNABLES", "") else None


def keep_freed_memory() -> str:
    """Raise the thresholds the user has not set, in this process; say which settings are in force (for the
    run's lineage): KEPT when both are ours."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt if sys.platform.startswith("linux") else None
    except (OSError, AttributeError):  # another C library (musl has no mallopt)
        mallopt = None
    said = []
    for threshold, (parameter, value, _, _) in THRESHOLDS.items():
        if users := users_setting(threshold):
            said.append(f"{threshold} threshold: the user's {users}")
        elif not (mallopt and mallopt(parameter, value)):
            said.append(f"{threshold} threshold: the C library's default")
    return "; ".join(said) or KEPT
