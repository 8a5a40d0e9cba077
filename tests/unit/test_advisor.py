"""The interval advisor: Young/Daly with C = the training time a checkpoint loses."""

import math

import pytest

from toolkit.report import plots
from toolkit.checkpoint.interval_advisor import advise, advise_for_run, mtbf_for_gpus
from toolkit.events import CheckpointEvent, TrainEvent
from toolkit.rundir import RunDir


def test_young_daly_arithmetic():
    # C = 1 s, M = 20,000 s: sqrt(2 * 1 * 20000) - 1 = 199 s
    advice = advise(cost_s=1.0, mtbf_s=20_000.0, restart_s=60.0, step_time_s=0.5)
    assert advice.interval_s == pytest.approx(199.0)
    assert advice.interval_steps == 398
    assert advice.lost_work_per_failure_s == pytest.approx(199 / 2 + 60)
    assert advice.overhead_pct == pytest.approx(100 * (1 / 199 + (199 / 2 + 60) / 20_000))
    # one checkpoint is written at a time: never more often than one takes to persist
    assert advise(cost_s=0.005, mtbf_s=600.0, persist_s=3.0).interval_s == 3.0
    assert mtbf_for_gpus(16384) == pytest.approx(54 * 24 * 3600 / 419)


@pytest.mark.parametrize("kwargs, message", [
    ({"cost_s": 0, "mtbf_s": 10.0}, "cost_s: 0 is not allowed; allowed: a positive number of seconds"),
    ({"cost_s": 1.0, "mtbf_s": -5.0}, "mtbf_s: -5.0 is not allowed"),
    ({"cost_s": 1.0, "mtbf_s": 10.0, "persist_s": -1}, "persist_s: -1 is not allowed; allowed: 0 or more"),
])
def test_bad_inputs_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        advise(**kwargs)
    with pytest.raises(ValueError, match="gpus: 0 is not allowed"):
        mtbf_for_gpus(0)


def test_the_issue_example_lost_time_changes_the_advice_by_thirty_times():
    """~100M model on this CPU: 3 ms blocked, ~3 s lost; 1,000 GPUs at Llama 3's failure rate (MTBF ~50.7 h)."""
    mtbf = mtbf_for_gpus(1000)
    naive, real = advise(cost_s=0.003, mtbf_s=mtbf), advise(cost_s=3.0, mtbf_s=mtbf)
    assert 30 < naive.interval_s < 36 and 16 * 60 < real.interval_s < 18 * 60
    # checkpointing at the naive interval really loses ~9% (3 s every 33 s); at the real optimum ~0.6%
    assert 8.5 < (3.0 / naive.interval_s) * 100 < 9.5 and real.overhead_pct < 0.7


def _run_with_checkpoints(tmp_path, events) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    for e in events:
        run.append_event(CheckpointEvent(path=f"step_{e['step']:08d}", bytes=1, deleted=[], **e))
    for step, elapsed_s in ((10, 5.0), (20, 10.0)):
        run.append_event(TrainEvent(step=step, elapsed_s=elapsed_s, loss=4.0, lr=1e-3, tokens_per_s=1.0,
                                    data_wait_pct=0.0, mfu=0.0))
    return run


def test_a_run_is_advised_on_its_median_lost_time(tmp_path):
    run = _run_with_checkpoints(tmp_path, [
        {"step": s, "blocking_ms": 3.0, "lost_ms": lost, "persist_ms": 900.0} for s, lost in
        ((10, 2500.0), (20, 3000.0), (30, 4000.0))])
    advice = advise_for_run(run.path, mtbf_s=50 * 3600.0)
    assert advice.cost_basis == "lost" and advice.cost_s == pytest.approx(3.0)
    assert advice.blocking_s == pytest.approx(0.003) and advice.step_time_s == pytest.approx(0.5)
    assert "training time lost 3.00 s per checkpoint (of which blocked 3.0 ms)" in advice.summary()
    assert plots.checkpoint_interval(advice, tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_from_before_lost_time_falls_back_to_blocking_and_says_so(tmp_path):
    run = _run_with_checkpoints(tmp_path, [{"step": 10, "blocking_ms": 40.0, "persist_ms": 900.0}])
    advice = advise_for_run(run.path, mtbf_s=3600.0)
    assert advice.cost_basis == "blocking" and advice.cost_s == pytest.approx(0.04)
    assert "recorded only its blocking time" in advice.summary()


def test_a_run_without_checkpoints_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="has no checkpoint events"):
        advise_for_run(_run_with_checkpoints(tmp_path, []).path, mtbf_s=3600.0)


def test_a_checkpoint_costing_half_the_mtbf_or_more_is_advised_once_per_mtbf_or_per_checkpoint():
    # outside Daly's first-order range (C >= M / 2) the interval is M; never shorter than a checkpoint takes
    assert advise(cost_s=10.0, mtbf_s=20.0, restart_s=0.0).interval_s == 20.0
    assert advise(cost_s=30.0, mtbf_s=20.0, restart_s=0.0).interval_s == 30.0
    assert advise(cost_s=9.99, mtbf_s=20.0, restart_s=0.0).interval_s == pytest.approx(math.sqrt(2 * 9.99 * 20) - 9.99)


def test_interval_in_steps_rounds_and_is_at_least_one():
    assert advise(cost_s=1.0, mtbf_s=20_000.0, step_time_s=0.3).interval_steps == 663  # 199 / 0.3 = 663.3
    assert advise(cost_s=1.0, mtbf_s=20_000.0, step_time_s=1000.0).interval_steps == 1
    assert advise(cost_s=1.0, mtbf_s=20_000.0).interval_steps is None


@pytest.mark.parametrize("kwargs, message", [
    ({"restart_s": -0.5}, "restart_s: -0.5 is not allowed; allowed: 0 or more seconds"),
    ({"restart_s": float("nan")}, "restart_s: nan is not allowed"),
    ({"persist_s": float("nan")}, "persist_s: nan is not allowed"),
    ({"cost_s": float("nan")}, "cost_s: nan is not allowed; allowed: a positive number of seconds"),
    ({"mtbf_s": 0.0}, "mtbf_s: 0.0 is not allowed"),
])
def test_bad_times_are_refused_not_turned_into_nan_advice(kwargs, message):
    with pytest.raises(ValueError, match=message):
        advise(**{"cost_s": 1.0, "mtbf_s": 3600.0, **kwargs})


@pytest.mark.parametrize("seconds, shown", [(119.9, "119.9 s"), (120.0, "2.0 min"), (7199.0, "120.0 min"),
                                            (7200.0, "2.0 h")])
def test_summary_picks_the_unit_of_the_interval(seconds, shown):
    advice = advise(cost_s=0.001, mtbf_s=1000.0, persist_s=seconds)  # the persist time sets the interval here
    assert advice.summary().startswith(f"checkpoint every {shown}:"), advice.summary()


def test_a_run_is_advised_on_its_measured_checkpoints_only_and_without_a_pace_when_it_has_none(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    for step, lost in ((10, None), (20, 2000.0), (30, 4000.0)):  # the first from before lost_ms was recorded
        run.append_event(CheckpointEvent(path=f"step_{step:08d}", bytes=1, deleted=[], step=step, blocking_ms=3.0,
                                         persist_ms=500.0, lost_ms=lost))
    run.append_event(TrainEvent(step=10, elapsed_s=5.0, loss=4.0, lr=1e-3, tokens_per_s=1.0, data_wait_pct=0.0,
                                mfu=0.0))  # one train event: no step time to convert with
    advice = advise_for_run(run.path, mtbf_s=3600.0)
    assert advice.cost_basis == "lost" and advice.cost_s == pytest.approx(3.0)
    assert advice.persist_s == pytest.approx(0.5) and advice.step_time_s is None and advice.interval_steps is None


def test_the_formula_text_is_true_outside_the_first_order_range():
    once_per_mtbf = advise(cost_s=600.0, mtbf_s=1000.0)
    assert "sqrt" not in once_per_mtbf.formula and once_per_mtbf.formula.endswith("T = M = 1,000.0 s")
    costlier = advise(cost_s=3000.0, mtbf_s=2000.0, persist_s=10.0)  # a checkpoint outlasts the MTBF
    assert costlier.interval_s == 3000.0 and costlier.formula.endswith("raised to the checkpoint cost 3,000.0 s")
