"""The training process keeps the memory a step frees (toolkit.train.allocator), in a fresh process each: the
allocator's settings are process-wide and permanent."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import PROJECT

# A step's pattern, in miniature: 200 blocks of 1 MiB allocated, written, freed, three times. The third round's
# page faults say whether the second round's memory was kept (no faults) or handed back to the OS (one per page).
STEPS = """
import ctypes, json, resource, sys
from toolkit.train import allocator
applied = allocator.keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
MIB = 2**20
blocks = [0] * 200  # sized once: a list grown among the blocks would lie above them and keep the heap from shrinking
for round in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(200):
        blocks[i] = libc.malloc(MIB)
    for b in blocks:
        ctypes.memset(b, 1, MIB)
    for b in blocks:
        libc.free(b)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"applied": applied, "faults": faults, "pages": 200 * MIB // resource.getpagesize()}))
"""

glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")


def _steps(mode: str, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    proc = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, cwd=PROJECT,
                          env={**environ, **env}, check=True)
    return json.loads(proc.stdout)


@glibc_only
def test_default_allocator_hands_freed_memory_back_and_faults_it_in_again():
    """Why the setting exists: glibc's defaults give a freed step's memory back, every step."""
    result = _steps("default")
    assert result["faults"] > result["pages"] // 2, result


@glibc_only
def test_kept_memory_is_reused_without_page_faults():
    result = _steps("keep")
    assert result["applied"] == "kept freed memory"
    assert result["faults"] < result["pages"] // 20, result


@glibc_only
@pytest.mark.parametrize("setting", [{"MALLOC_TRIM_THRESHOLD_": "131072"},
                                     {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}])
def test_a_users_own_allocator_settings_are_left_alone(setting):
    result = _steps("keep", **setting)
    assert result["applied"] == "trim threshold: the user's " + next(iter(setting)).replace(
        "GLIBC_TUNABLES", "glibc.malloc.trim_threshold"), result
    assert result["faults"] > result["pages"] // 2, result


def test_a_training_run_keeps_freed_memory_and_says_so(finished_runs):
    expected = "kept freed memory" if sys.platform.startswith("linux") else "the C library's defaults"
    assert finished_runs().read_lineage()["allocator"] == expected
