"""Default run directory names (toolkit.runs.launch.default_run_dir): two starts of one config never share one."""

from __future__ import annotations

from toolkit import config as config_mod
from toolkit.runs.launch import default_run_dir


def test_two_starts_of_one_config_in_the_same_second_get_two_directories(tmp_path):
    cfg = config_mod.load("tiny")
    # each start names its directory before it writes anything into it: the name must be taken when chosen
    first, second = default_run_dir(cfg, tmp_path), default_run_dir(cfg, tmp_path)
    assert first != second and first.is_dir() and second.is_dir(), (first, second)
    assert first.name.startswith(f"{cfg.name}-") and second.name.startswith(f"{cfg.name}-")
    assert list(first.iterdir()) == [] and list(second.iterdir()) == []


def test_many_default_names_in_a_row_are_all_distinct(tmp_path):
    cfg = config_mod.load("tiny")
    names = {default_run_dir(cfg, tmp_path).name for _ in range(20)}
    assert len(names) == 20, sorted(names)
