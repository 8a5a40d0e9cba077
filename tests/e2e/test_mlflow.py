"""MLflow tracking on real runs through the CLI: the workspace's SQLite store, read back with MLflow's own client (what
`mlflow ui --backend-store-uri` serves), holds one run per run directory, across a SIGKILL and a restart, with the
config as params, the attempt's tags, TensorBoard's scalars at events.jsonl's steps and values, and the run's files; a
tracking server that does not answer is reported once and training completes; a bad tracking field is refused before
anything is written.

No test starts MLflow's UI server: it comes with the full `mlflow` package, which is not installed (it needs a gunicorn
older than the inference server's; mlflow-skinny's own `mlflow server` lacks aiohttp)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from conftest import cli
from toolkit.checkpoint.store import flatten_config
from toolkit.ports import free_port
from toolkit.events import TrackingEvent, read_events
from toolkit.rundir import RunDir
from toolkit.runs.supervisor import LOG_NAME
from toolkit.train import tracking

# MLflow takes seconds to import: found here, imported by the tests that run
pytestmark = pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="the 'tracking' extra is not "
                                                                                 "installed")

# killed after step 25, checkpoints every 10 steps: the restart trains again from 20 (or 10, when the one at 20 was
# still being written)
RESTARTED = ("--set", "tracking.mlflow=always", "--set", "checkpoint.every_steps=10", "--set", "fault.kill_at_step=25",
             "--max-restarts", "1")


@pytest.fixture
def restarted_run(finished_runs) -> tuple[RunDir, "mlflow.tracking.MlflowClient", "mlflow.entities.Run"]:
    """The shared tiny run killed at step 25 and restarted, its MLflow client on the store it logged to, its MLflow
    run."""
    from mlflow.tracking import MlflowClient

    run = finished_runs(*RESTARTED)
    record = json.loads((run.path / tracking.RECORD_FILE).read_text())
    client = MlflowClient(tracking_uri=record["tracking_uri"])
    return run, client, client.get_run(record["run_id"])


def _by_step(pairs) -> dict[int, set]:
    found = defaultdict(set)
    for step, value in pairs:
        found[step].add(value)
    return dict(found)


def _tensorboard_tags(run: RunDir) -> set[str]:
    from tensorboard.backend.event_processing.event_multiplexer import EventMultiplexer

    multiplexer = EventMultiplexer().AddRunsFromDirectory(str(run.tb_dir))
    multiplexer.Reload()
    return {tag for tags in multiplexer.Runs().values() for tag in tags["scalars"]}


def test_the_workspace_store_holds_the_run_with_its_params_tags_scalars_and_files(restarted_run, tmp_path):
    run, client, logged = restarted_run
    # the default store: the workspace's (the shared run's own TRAINBOOK_WORKSPACE), SQLite, one run in it
    assert client.tracking_uri.startswith("sqlite:///")
    assert client.tracking_uri.endswith("/workspace/mlflow/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "tiny"]
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_id == logged.info.run_id and logged.info.status == "FINISHED"
    assert logged.info.run_name == run.path.name

    config = yaml.safe_load(run.config_path.read_text())
    assert logged.data.params == {key: value if isinstance(value, str) else json.dumps(value)
                                  for key, value in flatten_config(config).items()}
    lineage = run.read_lineage()
    assert {k: v for k, v in logged.data.tags.items() if k.startswith("trainbook.")} == {
        "trainbook.run_dir": str(run.path.resolve()), "trainbook.attempt": "1", "trainbook.engine": "torch",
        "trainbook.world_size": "1", "trainbook.config_sha256": lineage["config_sha256"]}

    # TensorBoard's names, and at each step the values events.jsonl holds
    assert set(logged.data.metrics) == _tensorboard_tags(run)
    records = run.events()
    fields = {"train/loss": ("train", "loss"), "perf/tokens_per_s": ("train", "tokens_per_s"),
              "eval/val_bpb": ("eval", "val_bpb"), "checkpoint/blocking_ms": ("checkpoint", "blocking_ms"),
              "memory/peak_mb/rank0": ("train", "peak_memory_mb")}
    for name, (kind, field) in fields.items():
        history = client.get_metric_history(logged.info.run_id, name)
        expected = [(r["step"], r[field][0] if field == "peak_memory_mb" else r[field]) for r in records
                    if r["event"] == kind]
        assert _by_step((m.step, m.value) for m in history) == _by_step(expected), name

    listed = {a.path for a in client.list_artifacts(logged.info.run_id, tracking.ARTIFACT_DIR)}
    assert listed == {f"{tracking.ARTIFACT_DIR}/{name}" for name in ("config.yaml", "lineage.json", "events.jsonl")}
    copy = Path(client.download_artifacts(logged.info.run_id, tracking.ARTIFACT_DIR, str(tmp_path)))
    for name in ("config.yaml", "events.jsonl"):
        assert (copy / name).read_bytes() == (run.path / name).read_bytes(), name


def test_a_run_killed_and_restarted_is_one_mlflow_run_holding_every_event_once(restarted_run):
    run, client, logged = restarted_run
    (restart,) = run.events("restart")
    assert restart["from_step"] in (10, 20)
    # the killed attempt's follower died with it, before or after it opened the MLflow run: either way the restart's
    # logs into the one run the record names, from where the killed one stopped
    opened = read_events(run, TrackingEvent)
    assert {(e.state, e.run_id) for e in opened} == {("logging", logged.info.run_id)} and len(opened) in (1, 2)
    assert opened[-1].message == f"mlflow ui --backend-store-uri {client.tracking_uri}"
    # one line from step 5 to 40: both attempts' intervals, the steps trained again with the same losses
    losses = _by_step((m.step, m.value) for m in client.get_metric_history(logged.info.run_id, "train/loss"))
    assert sorted(losses) == list(range(5, 41, 5))
    assert all(len(values) == 1 for values in losses.values()), losses
    # it read events.jsonl to the end; all that may follow is its own report, written by rank 0 once it was made
    record = json.loads((run.path / tracking.RECORD_FILE).read_text())
    after = run.events_path.read_bytes()[record["events_offset"]:].decode().splitlines()
    assert [json.loads(line)["event"] for line in after] in ([], ["tracking"]), after


def test_a_resumed_run_goes_on_in_the_same_mlflow_run(train_tiny):
    from mlflow.tracking import MlflowClient

    # with a DataLoader worker: a process forked from rank 0 that holds its pipes to the follower open
    proc, run = train_tiny("--set", "tracking.mlflow=always", "--set", "train.max_steps=20", "--set",
                           "checkpoint.every_steps=10", "--set", "data.num_workers=1")
    assert proc.returncode == 0, proc.stderr
    (first,) = read_events(run, TrackingEvent)
    client = MlflowClient(tracking_uri=first.uri)
    assert client.get_run(first.run_id).info.status == "FINISHED"
    resumed = cli("resume", str(run.path), "--from", "step_00000010")
    assert resumed.returncode == 0, resumed.stderr
    assert [(e.state, e.run_id) for e in read_events(run, TrackingEvent)] == [("logging", first.run_id)] * 2
    logged = client.get_run(first.run_id)
    assert logged.info.status == "FINISHED" and logged.data.tags["trainbook.attempt"] == "1"
    # steps 15 and 20 trained again from the checkpoint at 10: logged again, with the same losses
    history = [(m.step, m.value) for m in client.get_metric_history(first.run_id, "train/loss")]
    assert [step for step, _ in history] == [5, 10, 15, 20, 15, 20]
    assert history[2:4] == history[4:], history
    (experiment,) = [e for e in client.search_experiments() if e.name == "tiny"]
    assert len(client.search_runs([experiment.experiment_id])) == 1


def test_a_tracking_server_that_does_not_answer_is_reported_once_and_training_completes(train_tiny, monkeypatch):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # MLflow's own setting: fail now, not in 2 minutes
    proc, run = train_tiny("--set", f"tracking.mlflow_uri={uri}")
    assert proc.returncode == 0, proc.stderr
    assert run.read_status()["state"] == "completed"
    (reported,) = read_events(run, TrackingEvent)
    assert reported.state == "failed" and reported.uri == uri and reported.run_id is None
    assert "Connection refused" in reported.message or "Max retries exceeded" in reported.message, reported.message
    log = (run.path / LOG_NAME).read_text()
    assert log.count(f"MLflow tracking ({uri}) stopped, training goes on (TensorBoard, events.jsonl): ") == 1, log
    assert [e["step"] for e in run.events("train")] == list(range(5, 41, 5))
    assert "train/loss" in _tensorboard_tags(run)
    assert not (run.path / tracking.RECORD_FILE).exists()


def test_a_bad_tracking_field_is_refused_before_anything_is_written(tmp_path):
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", "tracking.mlflow_uri=/data/mlruns")
    assert proc.returncode != 0
    assert "tracking.mlflow_uri: '/data/mlruns' is not a URI (a folder is MLflow's old file store, which MLflow 3 " \
           "refuses: use sqlite:///FOLDER/mlflow.db)" in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="leaving SCHED_IDLE takes CAP_SYS_NICE or RLIMIT_NICE >= 1")
def test_the_follower_takes_only_idle_cpu_until_the_run_ends():
    """The follower at nice 19 still cost training ~5% on 2 busy cores (bench/bench_mlflow.py); SCHED_IDLE runs it
    only on a core training leaves idle, threads it starts included. At the end rank 0 gives it a normal policy and
    training's priority back (where allowed: here, root)."""
    probe = ("import os, sys, threading\n"
             "from toolkit.train.tracking import lowest_priority\n"
             "lowest_priority()\n"
             "seen = []\n"
             "thread = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0) == os.SCHED_IDLE))\n"
             "thread.start(); thread.join()\n"
             "print(os.sched_getscheduler(0) == os.SCHED_IDLE, seen[0], os.getpriority(os.PRIO_PROCESS, 0), flush=True)\n"
             "sys.stdin.readline()\n"
             "print(os.sched_getscheduler(0) == os.SCHED_OTHER, os.getpriority(os.PRIO_PROCESS, 0), flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", probe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **tracking.FOLLOWER_ENV})
    assert proc.stdout.readline().split() == ["True", "True", str(tracking.NICE)]
    tracking.training_priority(proc.pid)  # what MlflowFollower.end does
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.stdout.readline().split() == ["True", str(os.getpriority(os.PRIO_PROCESS, 0))]
    assert proc.wait(60) == 0
