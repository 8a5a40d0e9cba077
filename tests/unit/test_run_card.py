"""The run card (widgets.run_progress) says the same numbers as the notebook's cells: the time budget beside the
step count it moves, the steady-state speed at the end, an earlier attempt's end as history after a resume."""

from __future__ import annotations

from toolkit.events import StatusEvent, TrainEvent, read_events
from toolkit.rundir import RunDir
from toolkit.runs.progress import RunProgress
from toolkit.train.metrics import steady_state
from widgets.run_progress import progress_card


def train(step: int, tokens_per_s: float, horizon: int | None = None) -> TrainEvent:
    return TrainEvent(step=step, loss=3.0, lr=1e-3, tokens_per_s=tokens_per_s, data_wait_pct=0.1, mfu=0.05,
                      elapsed_s=step / 3, horizon=horizon)


def test_a_time_budget_is_named_beside_the_step_count_it_moves():
    progress = RunProgress(20_000, budget_s=180)
    card = progress_card("demo", progress, 0.0)
    assert "step (180 s budget)" in card and "20,000" not in card, "not the config's cap as if it were the goal"
    progress.apply(train(170, 8_000.0, horizon=439))
    card = progress_card("demo", progress, 0.0)
    assert "170 / ~439" in card, card
    progress.apply(StatusEvent(state="completed", step=540))
    progress.max_steps = progress.step = 540
    assert "540 / 540" in progress_card("demo", progress, 0.0)


def test_the_finished_card_shows_the_steady_state_the_cells_print_not_the_last_interval(tmp_path):
    run, progress = RunDir(tmp_path), RunProgress(40)
    for step, speed in ((10, 2_000.0), (20, 8_000.0), (30, 8_400.0), (40, 2_281.0)):
        progress.apply(run.append_event(train(step, speed)))
    running = progress_card("run", progress, 0.0, run=run)
    assert "2,281" in running and "2nd half" not in running
    assert "tokens/s, latest" in running and "MFU, latest" in running, "a live figure is named as one"
    progress.apply(StatusEvent(state="completed", step=40))
    done = progress_card("run", progress, 0.0, run=run)
    steady = steady_state(read_events(run, TrainEvent))
    assert f"{steady.tokens_per_s:,.0f}" in done and "tokens/s, 2nd half" in done and "2,281" not in done, done


def test_after_a_resume_the_kill_is_history_not_the_runs_state():
    progress = RunProgress(400)
    progress.apply(StatusEvent(state="running", attempt=0))
    progress.apply(train(60, 1_000.0))
    progress.apply(StatusEvent(state="killed", reason="signal SIGKILL"))
    progress.apply(StatusEvent(state="running", attempt=1, resumed_step=40))
    card = progress_card("run", progress, 0.0)
    assert progress.message == "" and progress.recovered == "signal SIGKILL"
    assert "resumed after an earlier attempt&#x27;s end (signal SIGKILL)" in card and "#d62728" not in card, card
