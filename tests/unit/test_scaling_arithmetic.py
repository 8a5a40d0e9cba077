"""The scaling series' arithmetic: process counts, the weak and strong batch, the measured window, efficiency, the
split of a step's time (from events and a profiler trace), and what is refused before any run starts."""

from __future__ import annotations

import pytest

from toolkit.config import ConfigError
from toolkit.runs import scaling
from toolkit.events import TrainEvent

TWO_CORES = scaling.capacity(0, 2)


@pytest.mark.parametrize("text, counts", [("1,2", [1, 2]), ("2", [1, 2]), ("4, 2,2", [1, 2, 4]), ("8,1,4", [1, 4, 8])])
def test_counts_are_sorted_distinct_and_include_the_baseline(text, counts):
    assert scaling.parse_counts(text) == counts


@pytest.mark.parametrize("text", ["", "0,2", "two", "1;2", "-1"])
def test_a_bad_count_list_is_refused_naming_the_flag(text):
    with pytest.raises(ConfigError, match=r"^--nproc: .* is not allowed; allowed: process counts of 1 or more"):
        scaling.parse_counts(text)


def test_capacity_is_a_process_per_gpu_else_per_usable_core():
    assert TWO_CORES == scaling.Capacity(2, "2 usable cores: one process per core", gpus=False)
    assert scaling.capacity(8, 2) == scaling.Capacity(8, "8 GPUs: one process per GPU", gpus=True)
    assert scaling.capacity(0, 1).why == "1 usable core: one process per core"
    scaling.check_capacity([1, 2], TWO_CORES)
    with pytest.raises(ConfigError) as refused:
        scaling.check_capacity([1, 2, 4], TWO_CORES)
    assert str(refused.value) == ("--nproc: 4 is more processes than this machine can run; allowed: 1 to 2 here "
                                  "(2 usable cores: one process per core)")


def test_weak_keeps_the_batch_per_process_strong_splits_the_global_batch():
    assert [scaling.per_process_batch(8, n, "weak") for n in (1, 2, 4)] == [8, 8, 8]
    assert [scaling.per_process_batch(8, n, "strong") for n in (1, 2, 4, 8)] == [8, 4, 2, 1]


def test_strong_refuses_a_count_that_does_not_divide_the_batch_with_the_arithmetic():
    with pytest.raises(ConfigError) as refused:
        scaling.per_process_batch(8, 3, "strong")
    message = str(refused.value)
    assert message.startswith("--nproc: 3 does not split train.batch_size=8 evenly (8 / 3 = 2.66667 sequences per "
                              "process); allowed: with --strong, counts that divide the global batch (1, 2, 4, 8)")


@pytest.mark.parametrize("steps, measured, every, warmup", [
    (20, 20, 5, 5), (8, 8, 2, 4), (10, 12, 3, 3), (1, 4, 1, 3), (40, 40, 10, 10)])
def test_the_window_is_whole_log_intervals_after_a_warm_up(steps, measured, every, warmup):
    lay = scaling.layout(steps)
    assert (lay.measured_steps, lay.log_every, lay.warmup_steps) == (measured, every, warmup)
    assert lay.measured_steps == scaling.INTERVALS * lay.log_every and lay.warmup_steps % lay.log_every == 0
    assert lay.warmup_steps >= scaling.WARMUP_MIN_STEPS and lay.last_measured == warmup + measured


def test_zero_steps_is_refused():
    with pytest.raises(ConfigError, match="--steps: 0 is not allowed; allowed: 1 or more"):
        scaling.layout(0)


def test_the_profiler_starts_after_the_window_and_the_run_ends_with_it():
    lay = scaling.layout(20)  # window: steps 5..25
    settings = dict(s.split("=", 1) for s in scaling.run_settings(2, 8, lay, threads=1, profiled=True))
    assert settings["profile.wait"] == "26"  # recording starts in the prof.step() ending step 26, outside the window
    assert settings["train.max_steps"] == str(25 + 2 + scaling.PROFILED_STEPS)
    assert settings["train.threads"] == "1" and settings["engine.nproc"] == "2" and settings["train.batch_size"] == "8"
    assert settings["checkpoint.at_end"] == "false" and settings["train.max_seconds"] == "0"
    plain = dict(s.split("=", 1) for s in scaling.run_settings(1, 8, lay, threads=0, profiled=False))
    assert plain["train.max_steps"] == "25" and plain["profile.enabled"] == "false" and "train.threads" not in plain


def test_efficiency_is_against_n_times_the_one_process_rate():
    assert scaling.efficiency(30_000.0, 2, 20_000.0) == pytest.approx(0.75)
    assert scaling.efficiency(20_000.0, 1, 20_000.0) == 1.0
    assert scaling.efficiency(70_000.0, 4, 20_000.0) == pytest.approx(0.875)


def train(step, tokens_per_s, elapsed_s, data_wait_pct=0.0, time=None):
    return TrainEvent(step=step, loss=1.0, lr=1e-3, tokens_per_s=tokens_per_s, data_wait_pct=data_wait_pct, mfu=0.1,
                      elapsed_s=elapsed_s, time=time)


def test_the_window_rate_is_tokens_over_time_and_skips_what_lies_outside():
    events = [train(5, 999.0, 1.0), train(10, 1000.0, 2.0, 10.0), train(15, 500.0, 4.0, 0.0),
              train(20, 1.0, 400.0)]  # step 20: the profiler wrote its trace in this interval
    window = scaling.measure_window(events, 5, 15)
    # equal steps per interval: the harmonic mean is total tokens over total time (5,000 + 5,000 tokens in 1 + 2 s)
    assert window.tokens_per_s == pytest.approx(2 / (1 / 1000 + 1 / 500))
    assert (window.tokens_per_s_min, window.tokens_per_s_max) == (500.0, 1000.0)
    assert window.step_ms == pytest.approx(1e3 * 3.0 / 10)
    assert window.data_wait_pct == pytest.approx((10.0 * 1 + 0.0 * 2) / 3)  # weighted by time
    with pytest.raises(scaling.ScalingError, match="no complete window from step 5 to 25"):
        scaling.measure_window(events, 5, 25)


def test_the_split_adds_up_to_the_step():
    parts = scaling.split(20.0, 10.0, 5.0)
    assert parts == pytest.approx({"data_wait_ms": 2.0, "communication_ms": 5.0, "compute_ms": 13.0})
    capped = scaling.split(10.0, 50.0, 8.0)  # profiled waits longer than what the window leaves: capped
    assert capped == pytest.approx({"data_wait_ms": 5.0, "communication_ms": 5.0, "compute_ms": 0.0})
    assert sum(capped.values()) == pytest.approx(10.0)


def op(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


def test_communication_counts_what_the_training_thread_waits_for():
    trace = {"traceEvents": [
        op("ProfilerStep#7", 0, 100, cat="user_annotation"), op("ProfilerStep#8", 100, 100, cat="user_annotation"),
        # step 7: backward's matmuls until 60, an all-reduce on gloo's thread from 40 to 80: 20 us hidden, 20 waited
        op("aten::mm", 0, 60), op("aten::broadcast_tensors", 60, 5), op("gloo:all_reduce", 40, 40, tid=2),
        # step 8: one all-reduce alone, 30 us, launched from the training thread (the launch is communication too)
        op("aten::mm", 100, 50), op("c10d::allreduce_", 150, 2), op("gloo:all_reduce", 152, 28, tid=3),
        op("PyTorch Profiler (0)", 0, 200, tid=0, cat="Trace"),
    ]}
    comm = scaling.communication(trace)
    # waited: step 7 from 65 to 80 (aten::broadcast_tensors is a shape op, busy until 65), step 8 from 150 to 180
    assert comm.steps == 2
    assert comm.exposed_ms == pytest.approx((15 + 30) / 1e3 / 2)
    assert comm.in_flight_ms == pytest.approx((40 + 30) / 1e3 / 2)


def test_a_trace_without_profiled_steps_is_an_error():
    with pytest.raises(scaling.ScalingError, match="no ProfilerStep"):
        scaling.communication({"traceEvents": [op("aten::mm", 0, 5)]})


def test_side_by_side_trials_are_measured_only_while_all_of_them_train():
    # trial A starts 1 s earlier: its intervals before B's warm-up ends (t = 2.0) do not count
    a = [train(5, 100.0, 0.0, time=1.0), *[train(5 + 5 * i, 100.0 + i, 0.0, time=1.0 + 0.5 * i) for i in range(1, 9)]]
    b = [train(5, 100.0, 0.0, time=2.0), *[train(5 + 5 * i, 200.0 + i, 0.0, time=2.0 + 0.5 * i) for i in range(1, 4)]]
    assert scaling.overlapping_windows([a, b], warmup=5, intervals=4) is None  # B has 3 intervals so far
    b.append(train(25, 204.0, 0.0, time=4.0))
    windows = scaling.overlapping_windows([a, b], warmup=5, intervals=4)
    assert [e.tokens_per_s for e in windows[0]] == [103.0, 104.0, 105.0, 106.0]  # from A's event at t = 2.0 on
    assert [e.tokens_per_s for e in windows[1]] == [201.0, 202.0, 203.0, 204.0]
    assert scaling.overlapping_windows([a, []], warmup=5, intervals=4) is None


def test_the_plan_refuses_before_any_folder_exists(tmp_path):
    out = tmp_path / "series"
    with pytest.raises(ConfigError, match=r"8 / 3 = 2\.66667"):
        scaling.plan("tiny", ["train.batch_size=8"], [1, 3], mode="strong", out=out, machine=scaling.capacity(0, 4))
    with pytest.raises(ConfigError, match="--nproc: 4 is more processes than this machine can run"):
        scaling.plan("tiny", [], [1, 4], out=out, machine=TWO_CORES)
    with pytest.raises(ConfigError, match="train.batch_siz"):
        scaling.plan("tiny", ["train.batch_siz=8"], [1, 2], out=out, machine=TWO_CORES)
    assert not out.exists()


def test_the_plan_gives_every_run_the_same_cores_and_its_batch(tmp_path):
    p = scaling.plan("tiny", ["train.batch_size=8"], [1, 2], mode="strong", steps=8, out=tmp_path / "s",
                     side_by_side=True, machine=TWO_CORES)
    assert [(r.label, r.nproc, r.config.train.batch_size, r.config.train.threads) for r in p.runs] == [
        ("tiny-n1", 1, 8, 1), ("tiny-n2", 2, 4, 1)]
    assert [r.config.profile.enabled for r in p.runs] == [True, True]
    assert not any(t.config.profile.enabled for t in p.side_by_side[2])
    assert [t.label for t in p.side_by_side[2]] == ["tiny-n1-trial1of2", "tiny-n1-trial2of2"]
    assert all(t.config.engine.nproc == 1 and t.config.train.batch_size == 8 for t in p.side_by_side[2])
    default = scaling.plan("tiny", [], None, out=tmp_path / "d", machine=scaling.capacity(0, 6))
    assert default.counts == [1, 2, 4] and default.threads == 1  # 6 cores / 4 processes
    gpus = scaling.plan("tiny", [], None, out=tmp_path / "g", machine=scaling.capacity(8, 2))
    assert gpus.counts == [1, 2, 4, 8] and gpus.threads == 0  # a GPU each: the trainer's own default


def test_an_out_folder_holding_this_series_is_refused(tmp_path):
    (tmp_path / "tiny-n2").mkdir()
    with pytest.raises(FileExistsError, match="--out: .* already holds tiny-n2"):
        scaling.plan("tiny", [], [1, 2], out=tmp_path, machine=TWO_CORES)


def test_a_trial_that_restarted_is_measured_on_its_last_attempt():
    first = [train(5, 50.0, 0.0, time=1.0), train(10, 50.0, 0.0, time=1.5)]  # then a failed start, a retry
    retry = [train(5, 100.0, 0.0, time=3.0), *[train(5 + 5 * i, 100.0 + i, 0.0, time=3.0 + i) for i in range(1, 5)]]
    other = [train(5, 200.0, 0.0, time=2.0), *[train(5 + 5 * i, 200.0 + i, 0.0, time=2.0 + i) for i in range(1, 9)]]
    windows = scaling.overlapping_windows([first + retry, other], warmup=5, intervals=4)
    assert [e.tokens_per_s for e in windows[0]] == [101.0, 102.0, 103.0, 104.0]
    assert [e.tokens_per_s for e in windows[1]] == [202.0, 203.0, 204.0, 205.0]  # from t = 3.0, the retry's warm end


def test_the_table_shows_percentages_and_side_by_side_only_when_measured():
    from toolkit.report.tables import scaling_html

    rows = [{"nproc": n, "batch_per_process": 8, "global_batch": 8 * n, "tokens_per_s": 1000.0 * n * eff,
             "tokens_per_s_min": 900.0, "tokens_per_s_max": 1100.0, "efficiency": eff, "step_ms": 8.0 / eff,
             "compute": 0.7, "communication": 0.25, "data_wait": 0.05, "side_by_side_tokens_per_s": side,
             "side_by_side_efficiency": side and side / 2000} for n, eff, side in ((1, 1.0, None), (2, 0.8, 1900.0))]
    doc = {"config": "tiny", "engine": "torch", "mode": "weak", "measured_steps": 20, "runs": rows}
    html = scaling_html(doc)
    left, right = "<td style='text-align:left'>", "<td style='text-align:right'>"
    assert f"{left}2 x 8 = 16</td>{right}1,600</td>" in html and f"{right}80%</td>" in html and f"{right}25%</td>" in html
    assert "1,900 (95%)" in html and "side by side" in html
    assert "side by side" not in scaling_html({**doc, "runs": [{**r, "side_by_side_tokens_per_s": None} for r in rows]})


def test_an_efficiency_above_100_percent_is_explained_once_and_only_then():
    assert scaling.above_linear_note([1.0, 0.93, None]) == ""
    note = scaling.above_linear_note([1.0, 1.79, None, 1.2])
    assert note.startswith("Above 100% (up to 179%)") and "low baseline" in note


def test_with_tensor_parallelism_the_series_counts_replicas_of_one_group_each(tmp_path):
    # engine.tensor_parallel=2: the baseline is one group of 2 processes; 4 processes are 2 replicas
    split = ["engine.tensor_parallel=2", "train.batch_size=8"]
    p = scaling.plan("tiny", split, scaling.parse_counts("4"), mode="strong", steps=8, out=tmp_path / "s",
                     machine=scaling.capacity(8, 2))
    assert [(r.nproc, r.replicas, r.config.train.batch_size, r.config.train.eval_batches) for r in p.runs] == [
        (2, 1, 8, 1), (4, 2, 4, 2)]
    assert scaling.plan("tiny", split, None, out=tmp_path / "d", machine=scaling.capacity(8, 2)).counts == [2, 4, 8]
    with pytest.raises(ConfigError) as caught:
        scaling.plan("tiny", split, [1, 3], out=tmp_path / "x", machine=scaling.capacity(8, 2))
    assert "--nproc: 3 is not a whole number of tensor-parallel groups of 2" in str(caught.value)
    with pytest.raises(ConfigError, match="--side-by-side"):
        scaling.plan("tiny", split, [1, 2], side_by_side=True, out=tmp_path / "y", machine=scaling.capacity(8, 2))


def test_with_pipeline_parallelism_the_series_counts_replicas_of_one_pipeline_each(tmp_path):
    # engine.pipeline_parallel=2: the baseline is one pipeline of 2 stages; 4 processes are 2 replicas
    staged = ["engine.pipeline_parallel=2", "train.grad_accum_steps=2", "train.batch_size=8"]
    p = scaling.plan("tiny", staged, scaling.parse_counts("4"), mode="weak", steps=8, out=tmp_path / "s",
                     machine=scaling.capacity(8, 2))
    assert [(r.nproc, r.replicas, r.config.train.batch_size) for r in p.runs] == [(2, 1, 8), (4, 2, 8)]
    with pytest.raises(ConfigError) as caught:
        scaling.plan("tiny", staged, [1, 6, 3], out=tmp_path / "x", machine=scaling.capacity(8, 2))
    assert "--nproc: 3 is not a whole number of pipelines of 2" in str(caught.value)
