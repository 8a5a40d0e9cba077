"""The interval advisor: Young/Daly with C = the training time a checkpoint loses."""

import pytest

from toolkit.report import plots
from toolkit.checkpoint.interval_advisor import advise, advise_for_run, mtbf_for_gpus
from toolkit.runs.events import CheckpointEvent, TrainEvent
from toolkit.runs.rundir import RunDir


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
