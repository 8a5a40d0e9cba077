"""`trainbook scale`: a real series through the CLI (1 and 2 processes of the tiny model), its table checked against
the runs' own events; what it refuses before any run starts; and notebook 03b through papermill."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from toolkit.report.demo import NOTEBOOKS, execute, guided_notebooks
from toolkit.events import TrainEvent, read_events
from toolkit.rundir import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs 2 cores")]

PROJECT = Path(__file__).resolve().parents[2]


def all_cores() -> None:
    """Under `make test` each pytest worker is pinned to one core (tests/conftest.py), and `scale` rightly refuses
    2 processes on 1 core: a series borrows the machine's cores for its few seconds (the kernel keeps only those
    this container may use)."""
    os.sched_setaffinity(0, range(os.cpu_count()))


@contextlib.contextmanager
def on_all_cores():
    saved = os.sched_getaffinity(0)
    all_cores()
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


def scale(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", "scale", *args], capture_output=True, text=True,
                          timeout=300, cwd=PROJECT, preexec_fn=all_cores, env={**os.environ, **(env or {})})


def tokens_per_s(row: dict) -> float:
    """The run's tokens over the window's time, from its own train events: each interval's seconds are its tokens
    (steps x the global batch's tokens) over its logged rate."""
    run = RunDir(row["run_dir"])
    cfg = run.read_config()
    per_step = cfg.train.batch_size * cfg.model.block_size * cfg.engine.nproc
    first, last = row["window_steps"]
    events = [e for e in read_events(run, TrainEvent) if first <= e.step <= last]
    seconds = sum(per_step * (b.step - a.step) / b.tokens_per_s for a, b in zip(events, events[1:]))
    return per_step * (last - first) / seconds


def test_a_series_of_1_and_2_processes_measures_each_run_from_its_own_events(tmp_path):
    out = tmp_path / "series"
    proc = scale("tiny", "--nproc", "1,2", "--steps", "8", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)  # stdout holds the JSON document alone
    assert json.loads((out / "scaling.json").read_text()) == doc
    one, two = doc["runs"]
    assert (one["nproc"], two["nproc"]) == (1, 2) and doc["mode"] == "weak"
    for row in (one, two):
        assert Path(row["run_dir"]).parent == out
        assert RunDir(row["run_dir"]).read_status()["state"] == "completed"
        assert row["tokens_per_s"] == pytest.approx(tokens_per_s(row), rel=1e-3)
        assert row["compute"] + row["communication"] + row["data_wait"] == pytest.approx(1.0)
        assert row["compute_ms"] + row["communication_ms"] + row["data_wait_ms"] == pytest.approx(row["step_ms"])
    # weak scaling: the batch per process stays, the global batch doubles
    assert (one["batch_per_process"], two["batch_per_process"], two["global_batch"]) == (8, 8, 16)
    assert two["efficiency"] == pytest.approx(tokens_per_s(two) / (2 * tokens_per_s(one)), rel=1e-3)
    assert one["efficiency"] == 1.0
    # one process all-reduces nothing; two wait for gloo's all-reduce (the tiny model's gradient is one bucket,
    # all-reduced after backward has finished: nothing to hide it behind)
    assert one["communication_ms"] == 0 and two["communication_ms"] > 0
    assert two["in_flight_ms"] >= two["communication_ms"]
    assert Path(doc["picture"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a line per run as it finishes, on stderr
    assert "[scale] 1 process(es): completed" in proc.stderr and "[scale] 2 process(es): completed" in proc.stderr


def test_strong_scaling_with_a_batch_that_does_not_split_is_refused_before_any_run(tmp_path):
    runs = tmp_path / "runs"
    proc = scale("tiny", "--strong", "--nproc", "1,2", "--set", "train.batch_size=7", env={"TRAINBOOK_RUNS": str(runs)})
    assert proc.returncode == 2, proc.stderr
    assert "--nproc: 2 does not split train.batch_size=7 evenly (7 / 2 = 3.5 sequences per process)" in proc.stderr
    assert not runs.exists()


def test_more_processes_than_the_machine_can_run_is_refused(tmp_path):
    too_many = os.cpu_count() + 1
    proc = scale("tiny", "--nproc", f"1,{too_many}", "--out", str(tmp_path / "series"))
    assert proc.returncode == 2, proc.stderr
    assert f"--nproc: {too_many} is more processes than this machine can run; allowed: 1 to " in proc.stderr
    assert "usable core" in proc.stderr
    assert not (tmp_path / "series").exists()


def test_the_scaling_notebook_measures_both_pieces_of_advice(tmp_path):
    notebook = NOTEBOOKS / "03b_scaling.ipynb"
    assert notebook in guided_notebooks()  # `make demo` runs it
    with on_all_cores():
        executed = execute(notebook, tmp_path, {"runs_root": str(tmp_path / "runs")})
    nb = nbformat.read(executed, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2, "the two series' pictures"
    # the forecast panel's static twin: two sizes at three node counts, each input with its source, the picture
    (panel,) = [o["data"]["text/html"] for o in outputs if "GPU-hours" in o.get("data", {}).get("text/html", "")]
    assert panel.count("Standard_ND96isr_H100_v5<") == 3 and panel.count("Standard_NC96ads_A100_v4<") == 3, panel
    assert "Chinchilla&#x27;s 20 tokens a parameter" in panel and "data:image/png;base64" in panel
    assert "fastest here: 4 x Standard_ND96isr_H100_v5" in text, text
    assert sum("efficiency vs linear" in o.get("data", {}).get("text/html", "") for o in outputs) == 2
    assert "a bigger batch per process raised scaling efficiency here: " in text, text
    assert "independent trials side by side got more done than one distributed run here: " in text, text
    small, large = sorted((json.loads((p / "scaling.json").read_text()) for p in (tmp_path / "runs").iterdir()),
                          key=lambda doc: doc["batch"])
    assert (small["batch"], large["batch"]) == (8, 32)
    # Neither piece of advice is asserted on the timings: on these 2 cores, shared with the other pytest worker (and
    # here with other people's jobs), a run that lands in a busy second loses half its speed. Measured here: batch 8
    # against 32 at 2 processes went either way (efficiency 0.80/0.68, 0.66/0.65, 0.61/0.80, 0.53/0.48), 2 against
    # 32 too under the suite's own load (0.78/0.55), and two trials side by side did 0.6x to 2.6x what one 2-process
    # run did. What no noise turns: what the advice rests on.
    ddp, ddp_large = small["runs"][1], large["runs"][1]
    # the same model, so the same gradient all-reduced every step, against 4x the tokens per step to hide it behind
    assert ddp_large["global_batch"] == 4 * ddp["global_batch"] and ddp["in_flight_ms"] > 0
    # the trials are 1-process runs: nothing to all-reduce, no profiler, each measured while the other trained
    assert ddp["side_by_side_tokens_per_s"] > 0 and len(ddp["side_by_side_runs"]) == 2
    for trial in ddp["side_by_side_runs"]:
        assert RunDir(trial).read_config().engine.nproc == 1 and not (Path(trial) / "profile").exists()
        assert RunDir(trial).read_status()["state"] == "stopped"  # stopped once both had a window side by side
