"""Thread counts follow the cores this process may use (its CPU affinity), not the machine's core count: a job
pinned by taskset, a cpuset or a container's --cpuset-cpus must not start more threads than it has cores."""

from __future__ import annotations

import contextlib
import os

import pytest

from toolkit import config as config_mod
from toolkit.machine import usable_cores
from toolkit.train.trainer import default_threads

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")


@contextlib.contextmanager
def pinned(cores: set[int]):
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_a_process_pinned_to_one_core_trains_with_one_thread(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = config_mod.load("tiny")
    one = min(os.sched_getaffinity(0))
    with pinned({one}):
        assert usable_cores() == 1
        assert default_threads(cfg) == 1


def test_ranks_share_the_usable_cores_and_an_explicit_thread_count_wins(monkeypatch):
    cfg = config_mod.load("tiny")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert default_threads(cfg) == max(1, len(os.sched_getaffinity(0)) // 2)
    assert default_threads(config_mod.load("tiny", ["train.threads=3"])) == 3
