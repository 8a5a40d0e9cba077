"""When the training loop checkpoints (checkpoint_due, the decision behind Checkpointer.due): by step, by
training time since the last checkpoint, and at the end; no checkpointer thread, no training step."""

from __future__ import annotations

import pytest

from toolkit.checkpoint.checkpointer import Checkpointer, checkpoint_due
from toolkit.config import CheckpointConfig, Config


def due_steps(cfg: CheckpointConfig, steps: int, seconds_per_step: float = 1.0) -> list[int]:
    """The steps a run of ``steps`` steps checkpoints at, its clock advancing ``seconds_per_step`` per step and
    the last save's time kept as the loop keeps it."""
    saved_at, out = 0.0, []
    for step in range(1, steps + 1):
        seconds = step * seconds_per_step
        if checkpoint_due(cfg, step, seconds, saved_at, final=step == steps):
            out.append(step)
            saved_at = seconds
    return out


def test_every_steps_checkpoints_on_its_multiples_and_at_the_end():
    assert due_steps(CheckpointConfig(every_steps=10), 35) == [10, 20, 30, 35]
    assert due_steps(CheckpointConfig(every_steps=10), 40) == [10, 20, 30, 40], "the last step once, not twice"


def test_every_steps_of_one_checkpoints_every_step():
    assert due_steps(CheckpointConfig(every_steps=1), 5) == [1, 2, 3, 4, 5]


def test_by_default_only_the_final_step_is_checkpointed():
    assert due_steps(CheckpointConfig(), 50) == [50]


def test_at_end_false_leaves_the_final_step_out_even_on_a_multiple():
    # the checkpoint-cost tests and the benchmarks rely on this: with at_end=false the last step is a plain step
    assert due_steps(CheckpointConfig(every_steps=20, at_end=False), 60) == [20, 40]
    assert due_steps(CheckpointConfig(at_end=False), 60) == []


def test_every_seconds_counts_training_time_since_the_last_checkpoint():
    assert due_steps(CheckpointConfig(every_seconds=2.5), 10) == [3, 6, 9, 10]
    # exactly the interval is due (>=), not one step later
    assert due_steps(CheckpointConfig(every_seconds=2.0), 7) == [2, 4, 6, 7]


def test_a_step_checkpoint_restarts_the_seconds_interval():
    # every 4 steps and every 3 s, 1 s per step: the step-4 checkpoint resets the clock, so the next
    # time-based one is at 7 s, not at 6 s
    assert due_steps(CheckpointConfig(every_steps=4, every_seconds=3.0), 12) == [3, 4, 7, 8, 11, 12]


@pytest.mark.parametrize("train_seconds, last_saved, due", [
    (9.99, 0.0, False), (10.0, 0.0, True), (25.0, 15.0, True), (24.9, 15.0, False),
    (100.0, 100.0, False),  # just resumed: last_saved_seconds is the checkpoint's own training time
])
def test_seconds_interval_boundaries(train_seconds, last_saved, due):
    assert checkpoint_due(CheckpointConfig(every_seconds=10.0), 7, train_seconds, last_saved, final=False) is due


def test_zero_turns_each_trigger_off():
    off = CheckpointConfig(every_steps=0, every_seconds=0.0)
    assert not checkpoint_due(off, 10, 1e9, 0.0, final=False)
    assert checkpoint_due(off, 10, 1e9, 0.0, final=True)



def test_the_checkpointer_decides_from_its_last_saved_time(tmp_path):
    # the loop asks Checkpointer.due; the time since the last save is the checkpointer's own (set by save and
    # by a resume), so it must reach the decision. No engine: nothing is saved here.
    checkpointer = Checkpointer(Config(checkpoint=CheckpointConfig(every_seconds=10.0)), tmp_path, rank=0,
                                world_size=1, engine=None)
    try:
        assert checkpointer.due(3, 12.0, final=False)
        checkpointer.last_saved_seconds = 5.0
        assert not checkpointer.due(3, 12.0, final=False)
        assert checkpointer.due(3, 15.0, final=False)
    finally:
        checkpointer.close()
