"""The watchdog through the CLI (issue 18, "a run never dies or hangs silently"): a NaN loss stops the run after a
checkpoint of the step before it, or is skipped and counted, on both engines; a hung rank is found, every rank's
Python stacks are dumped, and the supervisor restarts the run to completion."""

from __future__ import annotations

import math

import pytest

from toolkit.checkpoint.store import CheckpointStore
from toolkit.events import EvalEvent, HangEvent, NonFiniteEvent, RestartEvent, TrainEvent, read_events
from toolkit.rundir import RunDir

from conftest import cli

# tiny as it is (40 steps, logged every 5, evaluated at 20 and 40): start-up, not steps, is what a run costs, and
# the run without a fault is the suite's shared finished_runs()
NAN_AT_8 = ["--set", "fault.nan_at_step=8"]


def final_figures(run: RunDir) -> tuple[float, float]:
    return read_events(run, TrainEvent)[-1].loss, read_events(run, EvalEvent)[-1].val_loss


@pytest.mark.parametrize("flags", [[], ["--engine", "deepspeed"]], ids=["torch", "deepspeed-zero0"])
def test_a_nan_loss_stops_the_run_after_checkpointing_the_step_before(train_tiny, finished_runs, flags):
    # restarts allowed, yet none made: resumed exactly from the checkpoint before it, the step would be as bad again
    proc, run = train_tiny(*flags, *NAN_AT_8, "--max-restarts", "2")
    assert proc.returncode != 0
    status = run.read_status()
    assert status["state"] == "failed" and "step 8: loss nan" in status["error"], status.get("error")
    assert status["restarts"] == 0 and read_events(run, RestartEvent) == []
    assert "watchdog: step 8: loss nan" in proc.stderr  # the CLI's follow shows it
    assert "not restarted: a non-finite step: a restart from the checkpoint before it would repeat it" in proc.stderr
    [event] = read_events(run, NonFiniteEvent)
    assert (event.step, event.action, event.ranks, event.checkpoint) == (8, "stopped", [0], "step_00000007")
    assert CheckpointStore(run.path).latest_name() == "step_00000007"

    resumed = cli("resume", str(run.path))
    assert resumed.returncode == 0, resumed.stderr
    # the checkpoint holds step 7 with step 8's update left out: from it the run ends where one that never saw the
    # fault ends (the DeepSpeed engine matches the torch one to rounding)
    assert final_figures(run) == pytest.approx(final_figures(finished_runs()), rel=1e-4)


@pytest.mark.parametrize("flags", [["--nproc", "2"], ["--engine", "deepspeed", "--nproc", "2", "--set",
                                                      "engine.zero_stage=2"]], ids=["torch-ddp-2", "deepspeed-zero2-2"])
def test_a_nan_loss_on_one_rank_is_skipped_by_every_rank_and_counted(train_tiny, flags):
    proc, run = train_tiny(*flags, *NAN_AT_8, "--set", "watchdog.nonfinite=skip")
    assert proc.returncode == 0, proc.stderr
    [event] = read_events(run, NonFiniteEvent)
    assert (event.step, event.action, event.ranks, event.skipped) == (8, "skipped", [1], 1)  # the last rank's NaN
    train = read_events(run, TrainEvent)
    assert [e.nonfinite_skipped for e in train] == [0] + [1] * 7  # logged at 5, 10, ..., 40
    assert all(math.isfinite(e.loss) for e in train), [e.loss for e in train]
    assert math.isfinite(read_events(run, EvalEvent)[-1].val_loss)
    status = run.read_status()
    assert (status["state"], status["nonfinite_skipped"]) == ("completed", 1)


def test_a_hung_rank_is_dumped_recorded_and_restarted_by_the_supervisor(train_tiny):
    proc, run = train_tiny("--nproc", "2", "--max-restarts", "1", "--set", "fault.hang_at_step=8",
                           "--set", "watchdog.hang_min_seconds=5", "--set", "checkpoint.every_steps=5")
    assert proc.returncode == 0, proc.stderr
    dumps = run.path / "hangs" / "attempt_0"
    stuck, waiting = (dumps / "rank_1.txt").read_text(), (dumps / "rank_0.txt").read_text()
    assert "in injected_hang" in stuck  # the frame the last rank hangs in
    assert "in train_step" in waiting and "in injected_hang" not in waiting  # rank 0 waits for it in the step
    [hang] = read_events(run, HangEvent)
    assert (hang.step, hang.phase, hang.stacks, hang.attempt) == (8, "step", str(dumps), 0)
    assert 5.0 <= hang.waited_s < 60
    assert "watchdog: hang after step 8" in proc.stderr
    [restart] = read_events(run, RestartEvent)
    assert (restart.from_step, restart.checkpoint) == (5, "step_00000005")
    status = run.read_status()
    assert (status["state"], status["restarts"], status["step"]) == ("completed", 1, 40)
