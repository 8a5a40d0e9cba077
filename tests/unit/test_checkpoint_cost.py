"""The lost-time ledger: a checkpoint costs the excess of its steps over the plain step time."""

import pytest

from toolkit.checkpoint.cost import MAX_TAIL_STEPS, LostTimeLedger


def run(ledger, durations):
    """Feed step durations; return the costs the ledger closed."""
    return [c for d in durations if (c := ledger.step_done(d)) is not None]


def test_injected_slow_steps_are_what_is_reported():
    ledger = LostTimeLedger()
    run(ledger, [0.80, 0.81, 0.79, 0.80, 0.82, 0.78])
    ledger.checkpoint_started(step=6)
    ledger.add_blocking(0.010)
    assert run(ledger, [0.81]) == []           # the saving step: 10 ms of blocking inside it
    assert run(ledger, [1.90, 1.10]) == []     # background work still running: not closed
    ledger.background_done()
    assert run(ledger, [1.05]) == []           # still slow after the write finished: after-effects count
    (cost,) = run(ledger, [0.80])              # back to normal: closed
    assert cost.step == 6 and cost.steps == 5 and cost.basis == "measured"
    assert cost.baseline_step_s == pytest.approx(0.80)
    assert cost.lost_s == pytest.approx(0.01 + 1.10 + 0.30 + 0.25 + 0.0)
    assert cost.blocking_s == pytest.approx(0.010)


def test_noise_averages_out_and_the_cost_is_never_below_the_blocking():
    ledger = LostTimeLedger()
    run(ledger, [1.0, 1.1, 0.9, 1.0, 1.05, 0.95])
    ledger.checkpoint_started(step=10)
    ledger.add_blocking(0.002)
    ledger.background_done()
    (cost,) = run(ledger, [0.97])  # faster than the median: nothing was lost, but the blocking was
    assert cost.lost_s == pytest.approx(0.002)


def test_without_enough_plain_steps_the_cost_is_the_blocking():
    ledger = LostTimeLedger()
    run(ledger, [0.5, 0.5])
    ledger.checkpoint_started(step=2)
    ledger.add_blocking(0.25)
    ledger.background_done()
    (cost,) = run(ledger, [3.0])
    assert cost.basis == "blocking only" and cost.baseline_step_s is None and cost.lost_s == 0.25


def test_after_effects_are_followed_for_a_bounded_number_of_steps():
    ledger = LostTimeLedger()
    run(ledger, [0.1] * 10)
    ledger.checkpoint_started(step=10)
    ledger.background_done()
    costs = run(ledger, [0.3] * (MAX_TAIL_STEPS + 5))
    assert len(costs) == 1 and costs[0].steps == MAX_TAIL_STEPS
    assert costs[0].lost_s == pytest.approx(0.2 * MAX_TAIL_STEPS)
    assert ledger.step_done(0.3) is None and ledger.plain[-1] == 0.3  # later steps are plain steps again


def test_a_new_checkpoint_closes_the_previous_window_and_finish_closes_the_last():
    ledger = LostTimeLedger()
    run(ledger, [0.1] * 5)
    ledger.checkpoint_started(step=5)
    run(ledger, [0.4, 0.4])
    closed = ledger.checkpoint_started(step=7)
    assert closed.step == 5 and closed.lost_s == pytest.approx(0.6)
    run(ledger, [0.2])
    last = ledger.finish()
    assert last.step == 7 and last.lost_s == pytest.approx(0.1) and ledger.finish() is None


def test_the_baseline_is_taken_from_plain_steps_only():
    ledger = LostTimeLedger()
    run(ledger, [0.1] * 5)
    ledger.checkpoint_started(step=5)
    ledger.background_done()
    run(ledger, [5.0, 0.1])  # a slow checkpoint step must not raise the next checkpoint's baseline
    ledger.checkpoint_started(step=7)
    assert ledger.open.baseline == pytest.approx(0.1)


def test_on_a_noisy_machine_a_slow_step_does_not_pass_for_settled():
    ledger = LostTimeLedger()
    run(ledger, [0.02, 0.2, 0.03, 0.25, 0.02, 0.3, 0.04])  # wild plain steps: 3 robust deviations > the median
    ledger.checkpoint_started(step=7)
    ledger.background_done()
    assert run(ledger, [0.04 + 0.4]) == []  # the injected slowdown is still seen as one
