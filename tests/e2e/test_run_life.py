"""The run's life as a user drives it from a terminal: one writer per run directory, signals to a foreground
`train`, what `resume` says and refuses, what `kill` reports, and the MFU peak a run is measured against."""

from __future__ import annotations

import json
import re
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from toolkit.rundir import RunDir

from conftest import NO_CHECKPOINT, PROJECT, TWO_CHECKPOINTS, cli, cli_output, no_runaway_training
from served_model import SERVED_FLAGS

LONG = ["--set", "train.max_steps=100000", "--set", "train.log_every=1"]


def start_cli(*args: str) -> subprocess.Popen:
    """``python -m toolkit ARGS`` in the background, as a terminal would run it (stderr readable line by line)."""
    return subprocess.Popen([sys.executable, "-m", "toolkit", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=PROJECT)


def await_run_directory_line(proc: subprocess.Popen) -> str:
    """The CLI prints "run directory: ..." once the run is started and followed; returns that line."""
    for line in proc.stderr:
        if line.startswith("run directory:"):
            return line
    raise AssertionError(f"the CLI ended (exit {proc.wait()}) without starting a run")


def await_train_step(run: RunDir, step: int, timeout_s: float = 120) -> None:
    """Another process writes events.jsonl: re-read it until a train event at or past ``step`` is there."""
    deadline, offset = time.monotonic() + timeout_s, 0
    while time.monotonic() < deadline:
        events, offset = run.read_events(offset)
        if any(e["event"] == "train" and e["step"] >= step for e in events):
            return
        time.sleep(0.05)
    raise AssertionError(f"no train event at step {step} within {timeout_s} s")


def test_two_trains_into_one_run_dir_at_once_one_is_refused_naming_the_holder(tmp_path):
    run = RunDir(tmp_path / "r")
    args = ("train", "tiny", "--run-dir", str(run.path), *LONG)
    first, second = start_cli(*args), start_cli(*args)
    with no_runaway_training(run, first, second):
        by_fd = {os.pidfd_open(p.pid): p for p in (first, second)}
        ended, _, _ = select.select(list(by_fd), [], [], 60)  # the refused one ends; the other trains on
        assert ended, "neither start was refused: both trained into the same run directory"
        refused = by_fd[ended[0]]
        winner = first if refused is second else second
        _, err = refused.communicate()
        assert refused.returncode == 2, err
        holder = run.read_status().get("supervisor_pid")
        assert str(run.path) in err and (f"pid {holder}" in err or f"pid {winner.pid}" in err), err
        await_train_step(run, 3)
        winner.send_signal(signal.SIGINT)
        winner.communicate(timeout=60)
        assert run.read_status()["state"] == "stopped", run.read_status()  # Ctrl-C is a stop, not a death
        steps = [e["step"] for e in run.events("train")]
        assert len(steps) == len(set(steps)), "a step was trained twice: two writers in one run directory"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_terminated_foreground_train_stops_its_run(tmp_path, sig):
    run = RunDir(tmp_path / "r")
    proc = start_cli("train", "tiny", "--run-dir", str(run.path), *LONG)
    with no_runaway_training(run, proc):
        await_run_directory_line(proc)
        await_train_step(run, 2)
        proc.send_signal(sig)  # what `timeout`, a closed terminal or a cancelled CI job sends
        _, err = proc.communicate(timeout=60)
        assert proc.returncode != 0, err
        status = run.read_status()
        assert status["state"] == "stopped", status  # asked for: not a death, still resumable
        assert re.search(r"stopped at step \d+; ", err) and f"resume {run.path}" in err, err
        with pytest.raises(ProcessLookupError):
            os.killpg(status["worker_pgid"], 0)  # no training process outlives the CLI


def test_a_terminate_while_the_run_starts_stops_it_too(tmp_path):
    """SIGTERM once the run directory is written, before the CLI follows the run: the CLI must not die alone and
    leave the run training, detached (its handlers are in place before it starts anything)."""
    run = RunDir(tmp_path / "r")
    proc = start_cli("train", "tiny", "--run-dir", str(run.path), *LONG)
    with no_runaway_training(run, proc):
        deadline = time.monotonic() + 60
        while not run.config_path.exists():  # written by the start itself, before the supervisor is started
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.001)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, err
        status = run.read_status()
        assert status["state"] == "stopped", status
        with pytest.raises(ProcessLookupError):
            os.kill(status["supervisor_pid"], 0)
        if isinstance(status.get("worker_pgid"), int):
            with pytest.raises(ProcessLookupError):
                os.killpg(status["worker_pgid"], 0)


def _failed_copy_of(finished_run_copy, *flags: str) -> RunDir:
    run = finished_run_copy(*flags)
    run.write_status(state="failed")  # as if it had died: a run resume is meant for
    return run


def test_resume_says_which_checkpoint_it_starts_from(finished_run_copy):
    run = _failed_copy_of(finished_run_copy, *TWO_CHECKPOINTS)
    proc = cli("resume", str(run.path))
    assert proc.returncode == 0, proc.stderr
    assert "resuming from step_00000010" in proc.stderr, proc.stderr


def test_resume_without_a_checkpoint_says_it_starts_from_step_0(finished_run_copy):
    run = _failed_copy_of(finished_run_copy, *NO_CHECKPOINT)
    proc = cli("resume", str(run.path))
    assert proc.returncode == 0, proc.stderr
    assert "no checkpoint: starting from step 0" in proc.stderr, proc.stderr


def test_resume_of_a_completed_run_changes_nothing_and_says_why(finished_run_copy):
    run = finished_run_copy(*TWO_CHECKPOINTS)
    status, events = run.status_path.read_text(), run.events_path.read_text()
    again = cli("resume", str(run.path))
    assert again.returncode == 0, again.stderr
    assert "completed" in again.stderr and "--from" in again.stderr and "step_00000005" in again.stderr, again.stderr
    assert run.status_path.read_text() == status and run.events_path.read_text() == events
    assert not (run.path / "train.log").read_text().count("attempt 1"), "a worker was started"


def test_kill_reports_the_last_logged_step_the_signal_and_the_resume_command(tmp_path):
    run = RunDir(tmp_path / "r")
    proc = start_cli("train", "tiny", "--run-dir", str(run.path), *LONG, "--set", "checkpoint.every_steps=10")
    with no_runaway_training(run, proc):
        await_run_directory_line(proc)
        await_train_step(run, 30)
        killed = cli("kill", str(run.path))
        assert killed.returncode == 0, killed.stderr
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, err
        last = run.events("train")[-1]["step"]
        assert f"killed by SIGKILL at step {last}" in err, err
        assert f"resume {run.path}" in err and "training failed" not in err, err


def test_a_run_records_its_mfu_peak_and_a_lower_measurement_never_replaces_a_higher_one(tmp_path, monkeypatch):
    from toolkit.train import flops

    monkeypatch.setenv("TRAINBOOK_CACHE", str(tmp_path / "cache"))
    cache = tmp_path / "cache" / flops.CACHE.name
    assert cli("doctor", "--only", "matmul").returncode == 0
    measured = json.loads(cache.read_text())
    better = 2 * measured["flops"]  # as measured on a quiet machine, before this one got busy
    cache.write_text(json.dumps({**measured, "flops": better}))
    doctor = cli("doctor", "--only", "matmul")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert json.loads(cache.read_text())["flops"] == better, "a fresh (lower) measurement replaced a better one"

    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", "train.max_steps=5")
    assert proc.returncode == 0, proc.stderr
    run = RunDir(tmp_path / "r")
    assert run.read_status()["peak_flops"] == better
    assert run.read_lineage()["mfu_peak"]["flops"] == better
    start = run.events("status")[0]
    assert start["peak_flops"] == better
    train = run.events("train")[-1]
    assert train["mfu"] == pytest.approx(train["tokens_per_s"] * start["flops_per_item"] / better, rel=1e-3, abs=2e-6)


def test_watch_and_stop_a_run_started_in_another_terminal(tmp_path):
    """`watch` re-attaches to a run it did not start (Ctrl-C leaves the run training); `stop` makes the run save
    a checkpoint at the step it is in and end as stopped; both then say how it ended, and refuse to act again."""
    from toolkit.checkpoint.store import CheckpointStore

    run = RunDir(tmp_path / "r")
    train = start_cli("train", "tiny", "--run-dir", str(run.path), *LONG)
    with no_runaway_training(run, train):
        await_run_directory_line(train)
        await_train_step(run, 2)
        watch = start_cli("watch", str(run.path))
        assert watch.stderr.readline().startswith(f"run directory: {run.path}")
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=60)
        assert watch.returncode == 130 and "the run goes on" in err, err
        assert run.read_status()["state"] == "running"

        stopped = cli("stop", str(run.path))
        assert stopped.returncode == 0, stopped.stderr
        status = run.read_status()
        assert status["state"] == "stopped", status
        latest = CheckpointStore(run.path).list()[-1]
        assert latest.valid and latest.step == status["step"], (latest, status)  # the step it stopped at, saved
        assert f"stopped at step {latest.step}; latest checkpoint: {latest.name}" in stopped.stdout, stopped.stdout
        _, err = train.communicate(timeout=60)  # the foreground train sees its run stopped from elsewhere
        assert f"stopped at step {latest.step}" in err and f"resume {run.path}" in err, err

    watched = cli("watch", str(run.path))
    assert watched.returncode == 0 and f"has stopped at step {latest.step}" in watched.stdout, watched.stderr
    again = cli("stop", str(run.path))
    assert again.returncode == 2 and "has stopped" in again.stderr and "a run that is running" in again.stderr

    assert run.stop_requested()  # the request stays with the stopped run; a resume must not take it as its own
    resumed = start_cli("resume", str(run.path))
    with no_runaway_training(run, resumed):
        await_train_step(run, latest.step + 3)
        assert cli("stop", str(run.path)).returncode == 0
        resumed.communicate(timeout=60)
    assert run.read_status()["state"] == "stopped" and run.read_status()["step"] >= latest.step + 3


def test_stop_on_two_processes_saves_one_step_that_every_rank_agreed_on(tmp_path):
    """Under torchrun, with DataLoader worker processes: neither may get a signal (torch kills a DataLoader worker
    on SIGTERM; torchrun SIGKILLs its ranks 30 s after one), so the stop reaches the ranks as a request."""
    from toolkit.checkpoint.store import CheckpointStore

    run = RunDir(tmp_path / "r")
    train = start_cli("train", "tiny", "--nproc", "2", "--run-dir", str(run.path), "--set", "data.num_workers=1",
                      *LONG)
    with no_runaway_training(run, train):
        await_run_directory_line(train)
        await_train_step(run, 2)
        stopped = cli("stop", str(run.path))
        train.communicate(timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    status = run.read_status()
    (latest,) = [c for c in CheckpointStore(run.path).list() if c.step == status["step"]]
    assert latest.valid, latest.reason  # every rank's share of the same step, complete
    assert "Traceback" not in (run.path / "train.log").read_text()
    watched = cli("watch", str(run.path))  # a run that ended: watch says how, and follows nothing
    assert watched.returncode == 0 and "has stopped" in watched.stdout


def test_a_run_followed_into_a_file_gets_plain_lines_not_a_redrawn_bar(finished_runs):
    printed = cli_output(finished_runs(*SERVED_FLAGS))  # what `train` wrote into a pipe, as into a file
    assert "\r" not in printed, printed[:500]
    assert re.search(r"^step 30/30 loss=\d", printed, re.M), printed
