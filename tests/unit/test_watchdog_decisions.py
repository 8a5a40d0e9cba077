"""The watchdog's decisions (toolkit.train.watchdog): when a rank is overdue, what a non-finite step means for the
run, what the torch engine does with one, and what the hang watch leaves behind when it fires, in this process.
(tests/e2e/test_watchdog.py runs the faults through the CLI, both engines, the supervisor.)"""

from __future__ import annotations

import dataclasses
import math
import threading

import pytest
import torch

from toolkit import config as config_mod
from toolkit import status as run_status
from toolkit.events import EventLog, HangEvent, NonFiniteEvent, TrainEvent, read_events
from toolkit.rundir import RunDir
from toolkit.train.distributed import Topology
from toolkit.train.engines import build_engine
from toolkit.train.models import build_model
from toolkit.train.faults import nan_loss
from toolkit.train.trainer import train_step
from toolkit.train.watchdog import WARMUP_STEPS, WINDOW, HangClock, HangWatchdog, NonFiniteGuard

CPU = Topology(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def watchdog_cfg(**fields):
    return dataclasses.replace(config_mod.WatchdogConfig(), **fields)


# --- when a rank is overdue --------------------------------------------------------------------------------

def clock_after(step_seconds: list[float], **fields) -> tuple[HangClock, float]:
    """A clock that has seen steps of these durations, one after the other from t=0; (clock, now)."""
    clock, now = HangClock(watchdog_cfg(**fields)), 0.0
    clock.start(now, 0)
    for step, seconds in enumerate(step_seconds, 1):
        now += seconds
        clock.step_done(now, step)
    return clock, now


def test_the_first_steps_get_the_allowance_then_the_factor_times_the_median_step():
    clock, now = clock_after([], hang_allowance_seconds=900.0)
    assert clock.deadline() == now + 900.0, "before any step (compiling, warming up)"
    clock, now = clock_after([30.0] + [0.5] * (WARMUP_STEPS - 2), hang_allowance_seconds=900.0)
    assert clock.deadline() == now + 900.0, "still warming up"
    clock, now = clock_after([30.0] + [0.5] * (WARMUP_STEPS - 1), hang_factor=10, hang_min_seconds=1.0)
    assert clock.deadline() == now + 10 * 0.5, "the slow first step does not move the median"


def test_the_step_time_is_the_median_of_the_recent_window_at_least_the_floor():
    clock, now = clock_after([2.0] * 50 + [0.2] * (WINDOW // 2 + 1), hang_factor=10, hang_min_seconds=1.0)
    assert clock.limit("step") == pytest.approx(2.0), "older steps leave the window: the rank got faster"
    clock, _ = clock_after([0.01] * 30, hang_factor=10, hang_min_seconds=3.0)
    assert clock.limit("step") == 3.0, "fast steps: the floor"
    clock, _ = clock_after([1.0] * 30 + [40.0], hang_factor=10, hang_min_seconds=3.0)
    assert clock.limit("step") == 10.0, "one slow step (a checkpoint's write) is not the new normal"


def test_a_phase_gets_the_allowance_the_first_time_then_the_factor_times_its_longest():
    clock, now = clock_after([0.1] * 10, hang_factor=10, hang_min_seconds=1.0, hang_allowance_seconds=600.0)
    clock.enter(now, "evaluation")
    assert clock.deadline() == now + 600.0
    clock.leave(now + 7.0)
    assert clock.deadline() == now + 7.0 + 1.0, "after it, steps are judged again, from its end"
    clock.step_done(now + 7.1, 11)
    assert clock.recent[-1] == pytest.approx(0.1), "its time is not a step's"
    clock.enter(now + 8.0, "evaluation")
    assert clock.deadline() == now + 8.0 + 70.0
    clock.enter(now + 9.0, "checkpoint")
    assert clock.deadline() == now + 9.0 + 600.0, "each phase its own history"


def test_the_allowance_is_never_below_the_floor():
    clock, now = clock_after([], hang_allowance_seconds=5.0, hang_min_seconds=60.0)
    assert clock.deadline() == now + 60.0


# --- what a non-finite step means for the run --------------------------------------------------------------

def test_skip_counts_until_too_many_in_a_row_and_stop_stops_at_once():
    guard = NonFiniteGuard(watchdog_cfg(nonfinite="skip", max_consecutive_skips=3), skipped=4)
    assert [guard.judge(bad) for bad in (True, False, True, True)] == ["skipped", None, "skipped", "skipped"]
    assert (guard.skipped, guard.in_a_row) == (7, 2)
    assert guard.train_fields() == {"nonfinite_skipped": 7}
    assert guard.judge(True) == "stopped", "the third in a row: the run is not recovering"
    stop = NonFiniteGuard(watchdog_cfg(nonfinite="stop"))
    assert (stop.judge(False), stop.judge(True), stop.skipped, stop.train_fields()) == (None, "stopped", 0, {})


def test_the_event_names_the_step_the_loss_and_the_ranks_it_was_not_finite_on():
    guard = NonFiniteGuard(watchdog_cfg(nonfinite="skip"))
    guard.judge(True)
    event = guard.event(8, [2.5, math.nan], "skipped")
    assert (event.loss, event.ranks, event.skipped, event.in_a_row) == ("nan", [1], 1, 1)
    assert event.summary == "step 8: loss nan (not finite on rank 1), update not applied; skipped (1 so far, 1 in a row)"
    stopped = NonFiniteGuard(watchdog_cfg()).event(9, [2.0, 3.0], "stopped", "step_00000008")
    assert stopped.summary == ("step 9: loss 2.5 (finite; its gradients were not), update not applied; the run stops: "
                               "checkpoint step_00000008 holds the state before it")


# --- the torch engine leaves a non-finite update out -------------------------------------------------------

def tiny_engine(*overrides: str):
    cfg = config_mod.load("tiny", list(overrides))
    torch.manual_seed(0)
    return build_engine(build_model(cfg.model), cfg, CPU)


def state_of(engine) -> list[torch.Tensor]:
    moments = [t for s in engine.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return [t.detach().clone() for t in (*engine.module.parameters(), *moments)]


@pytest.mark.parametrize("clip", ["1.0", "0"], ids=["clipped-norm", "own-norm"])
def test_a_nan_loss_leaves_weights_and_moments_as_they_were(clip):
    engine = tiny_engine(f"optim.grad_clip={clip}")
    batch = {"input_ids": torch.randint(0, 256, (4, 32)), "labels": torch.randint(0, 256, (4, 32))}
    train_step(engine, [batch])
    assert not engine.update_skipped
    before = state_of(engine)
    with nan_loss(engine):
        assert math.isnan(train_step(engine, [batch]).item())
    assert engine.update_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, state_of(engine)))
    assert all(p.grad is None for p in engine.module.parameters()), "nothing carries over into the next step"
    assert math.isfinite(train_step(engine, [batch]).item()) and not engine.update_skipped


def test_with_nonfinite_apply_the_nan_update_is_applied():
    engine = tiny_engine("watchdog.nonfinite=apply")
    batch = {"input_ids": torch.randint(0, 256, (4, 32)), "labels": torch.randint(0, 256, (4, 32))}
    with nan_loss(engine):
        train_step(engine, [batch])
    assert not engine.update_skipped
    assert any(not torch.isfinite(p).all() for p in engine.module.parameters())


# --- the hang watch, firing ---------------------------------------------------------------------------------

def test_a_stalled_rank_dumps_its_stacks_records_the_hang_and_ends(tmp_path):
    cfg = config_mod.load("tiny", ["watchdog.hang_min_seconds=0.3", "watchdog.hang_allowance_seconds=60"])
    run = RunDir.create(tmp_path / "run", cfg)
    run_status.transition(run, "start")
    events = EventLog(run.events_path)
    ended = threading.Event()
    watchdog = HangWatchdog(cfg, run, rank=0, world_size=2, attempt=3, events=events, end=ended.set)
    watchdog.start(0)
    for step in range(1, WARMUP_STEPS + 1):
        watchdog.step_done(step)
    # the warm-up's 60 s deadline gave way to 0.3 s: the thread must see the nearer deadline, not sleep out the old
    ended_in_time = ended.wait(timeout=30)
    watchdog.close()
    events.close()
    assert ended_in_time
    dump = (run.path / "hangs" / "attempt_3" / "rank_0.txt").read_text()
    assert dump.startswith(f"rank 0 of 2: hang after step {WARMUP_STEPS} (in step)")
    assert "in test_a_stalled_rank_dumps_its_stacks_records_the_hang_and_ends" in dump, "the stalled frame"
    assert "MainThread" in dump and "trainbook-watchdog" in dump
    [hang] = read_events(run, HangEvent)
    assert (hang.step, hang.phase, hang.limit_s, hang.attempt) == (WARMUP_STEPS, "step", 0.3, 3)
    assert hang.waited_s >= 0.3 and hang.stacks == str(run.path / "hangs" / "attempt_3")
    status = run.read_status()
    assert status["state"] == "failed" and status["error"].startswith(f"hang: hang after step {WARMUP_STEPS}")


# --- where people see it ----------------------------------------------------------------------------------

def test_the_card_shows_the_skip_count_and_the_watchdog_notice():
    from widgets.run_progress import render_card

    train = TrainEvent(step=10, loss=4.2, lr=1e-3, tokens_per_s=1000.0, data_wait_pct=0.1, mfu=0.01, elapsed_s=1.0,
                       nonfinite_skipped=2)
    notice = NonFiniteEvent(step=8, loss="nan", ranks=[1], action="skipped", skipped=2, in_a_row=1).summary
    card = render_card("run", "running", 10, 20, train, None, 0.0, watchdog=notice)
    assert "non-finite skipped" in card and "2 steps" in card
    assert "watchdog</span>" in card and "step 8: loss nan (not finite on rank 1)" in card
