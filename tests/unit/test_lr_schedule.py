"""The learning-rate schedule (lr_at) and where it ends under a time budget (time_budget_horizon): pure
arithmetic, checked at its edges without a training step."""

from __future__ import annotations

from dataclasses import replace

import pytest

from toolkit.config import OptimConfig, TrainConfig
from toolkit.train.trainer import lr_at, time_budget_horizon

OPTIM = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, schedule="cosine")


def test_warmup_rises_linearly_and_reaches_the_peak_on_its_last_step():
    # step is the number of optimizer steps already taken: step 0 is the first update, so it gets lr / warmup
    assert [lr_at(s, OPTIM, 100) for s in (0, 4, 9)] == pytest.approx([1e-4, 5e-4, 1e-3])
    assert lr_at(10, OPTIM, 100) == pytest.approx(1e-3), "the decay starts from the peak"


def test_cosine_decays_from_the_peak_through_the_midpoint_to_min_lr_at_the_horizon():
    assert lr_at(55, OPTIM, 100) == pytest.approx((1e-3 + 1e-4) / 2)  # half-way between warmup and horizon
    assert lr_at(100, OPTIM, 100) == pytest.approx(1e-4)
    decay = [lr_at(s, OPTIM, 100) for s in range(10, 101)]
    assert all(a > b for a, b in zip(decay, decay[1:])), "strictly decreasing after warmup"


@pytest.mark.parametrize("step", [101, 150, 10**6])
def test_past_the_horizon_the_rate_stays_at_min_lr(step):
    # a resumed run with a larger max_steps, or a time budget whose projection fell short, trains on at min_lr
    assert lr_at(step, OPTIM, 100) == pytest.approx(1e-4)


def test_the_horizon_sets_where_the_decay_ends():
    assert lr_at(50, OPTIM, 50) == pytest.approx(1e-4)
    assert lr_at(50, OPTIM, 90) == pytest.approx((1e-3 + 1e-4) / 2)


def test_constant_schedule_holds_the_peak_after_warmup():
    constant = replace(OPTIM, schedule="constant")
    assert lr_at(0, constant, 100) == pytest.approx(1e-4), "warmup applies to both schedules"
    assert {lr_at(s, constant, 100) for s in (10, 50, 100, 500)} == {1e-3}


def test_no_warmup_starts_at_the_peak():
    no_warmup = replace(OPTIM, warmup_steps=0)
    assert lr_at(0, no_warmup, 100) == pytest.approx(1e-3)
    assert lr_at(100, no_warmup, 100) == pytest.approx(1e-4)


@pytest.mark.parametrize("max_steps", [1, 5, 10])
def test_a_horizon_inside_the_warmup_does_not_divide_by_zero(max_steps):
    # max_steps <= warmup_steps: the run ends inside the warmup; past it the whole decay takes one step
    assert lr_at(max_steps - 1, OPTIM, max_steps) == pytest.approx(1e-3 * max_steps / 10)
    assert lr_at(10, OPTIM, max_steps) == pytest.approx(1e-3)
    assert lr_at(11, OPTIM, max_steps) == pytest.approx(1e-4)


def test_min_lr_equal_to_lr_is_flat_after_warmup():
    flat = replace(OPTIM, min_lr=1e-3)
    assert {round(lr_at(s, flat, 100), 12) for s in range(10, 120)} == {1e-3}


TRAIN = TrainConfig(max_steps=10_000, max_seconds=180.0)


def test_horizon_projects_the_steps_the_time_budget_allows():
    assert time_budget_horizon(300, 45.0, TRAIN) == 1200  # the docstring's example: 300 steps in 45 s of 180 s
    assert time_budget_horizon(10, 3.0, TRAIN) == 600
    assert time_budget_horizon(7, 3.0, TRAIN) == 420


def test_horizon_rounds_to_the_nearest_step():
    assert time_budget_horizon(3, 1.0, replace(TRAIN, max_seconds=1.7)) == 5  # 5.1
    assert time_budget_horizon(3, 1.0, replace(TRAIN, max_seconds=1.9)) == 6  # 5.7


def test_horizon_never_passes_max_steps():
    assert time_budget_horizon(300, 1.0, TRAIN) == 10_000  # a fast pace would project 54,000 steps
    assert time_budget_horizon(9_000, 1.0, TRAIN) == 10_000


@pytest.mark.parametrize("seconds", [180.0, 200.0, 10_000.0])
def test_horizon_at_or_past_the_budget_is_the_next_step(seconds):
    # the budget is spent: the schedule must end now, yet stay ahead of the step just taken (lr_at reaches
    # min_lr at the horizon, not before it)
    assert time_budget_horizon(300, seconds, TRAIN) == 301


def test_horizon_at_max_steps_still_moves_past_the_step_taken():
    # max_steps reached and the budget not spent: the step-based end decides, one past the step just taken
    assert time_budget_horizon(50, 1.0, replace(TRAIN, max_steps=50)) == 51


def test_schedule_under_a_time_budget_reaches_min_lr_when_the_budget_runs_out():
    horizon = time_budget_horizon(300, 45.0, TRAIN)
    assert lr_at(horizon, OPTIM, horizon) == pytest.approx(OPTIM.min_lr)
    assert lr_at(horizon // 2, OPTIM, horizon) > 4 * OPTIM.min_lr


def test_a_step_floor_keeps_a_slow_machines_schedule_at_the_floor():
    floor = replace(TRAIN, min_steps=540)
    assert time_budget_horizon(100, 60.0, floor) == 540  # half as fast: 300 steps in the budget, 540 at least
    assert time_budget_horizon(300, 45.0, floor) == 1200  # a normal pace is above the floor: unchanged
    assert time_budget_horizon(300, 200.0, floor) == 540  # the budget spent, the floor not yet reached
    assert time_budget_horizon(300, 1.0, replace(floor, min_steps=20_000)) == 10_000  # never past max_steps
