"""Where MLflow tracking goes, what it is given, and the tracking config's refusals: pure logic, no MLflow import (the
real store, server and runs are in tests/e2e/test_mlflow.py)."""

from __future__ import annotations

import json

import pytest

from toolkit import config as config_mod
from toolkit.events import CheckpointEvent, EvalEvent, ProfileEvent, TrainEvent
from toolkit.train import tracking
from toolkit.train.scalars import scalars

AZURE_ML = {"MLFLOW_TRACKING_URI": "azureml://eastus.api.azureml.ms/mlflow/v1.0/subscriptions/s/resourceGroups/g/"
                                   "providers/Microsoft.MachineLearningServices/workspaces/w",
            "MLFLOW_RUN_ID": "job-run-1"}


def _cfg(*overrides: str):
    return config_mod.load("tiny", list(overrides))


def test_by_default_mlflow_is_off_locally_and_on_in_an_azure_ml_job_logging_into_the_jobs_own_run(tmp_path):
    assert tracking.destination(_cfg(), tmp_path, {}, {}) is None
    where = tracking.destination(_cfg(), tmp_path, AZURE_ML, {})
    assert where == tracking.Destination(AZURE_ML["MLFLOW_TRACKING_URI"], "tiny", run_id="job-run-1", job_run=True)
    assert where.artifact_root is None
    assert tracking.destination(_cfg("tracking.mlflow=never"), tmp_path, AZURE_ML, {}) is None


def test_always_logs_locally_into_the_workspaces_sqlite_store_beside_its_artifacts(tmp_path):
    where = tracking.destination(_cfg("tracking.mlflow=always", "tracking.experiment=mine"), tmp_path / "run", {}, {},
                                 workspace=tmp_path / "ws")
    db = tmp_path / "ws" / "mlflow" / "mlflow.db"
    assert where == tracking.Destination(f"sqlite:///{db}", "mine")
    assert where.uri == f"sqlite:////{str(db).lstrip('/')}" and where.artifact_root == db.parent / "artifacts"


def test_a_given_uri_wins_and_is_not_the_jobs_run(tmp_path):
    where = tracking.destination(_cfg("tracking.mlflow_uri=http://127.0.0.1:5000"), tmp_path, AZURE_ML, {})
    assert where == tracking.Destination("http://127.0.0.1:5000", "tiny")


def test_a_resume_logs_into_the_run_its_record_names_from_where_the_last_follower_stopped(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    uri = f"sqlite:///{tmp_path}/ws/mlflow/mlflow.db"
    (run / tracking.RECORD_FILE).write_text(json.dumps({"tracking_uri": uri, "run_id": "abc", "run_dir": str(run),
                                                        "events_offset": 1234}))
    record = tracking.read_record(run)
    where = tracking.destination(_cfg("tracking.mlflow=always"), run, {}, record, workspace=tmp_path / "ws")
    assert where == tracking.Destination(uri, "tiny", run_id="abc", events_offset=1234)
    # another store (another workspace, a URI given): a new MLflow run there, from the first event; the record never
    # chooses the store (a copied run directory is data: it must not say where anything is written)
    other = tracking.destination(_cfg("tracking.mlflow=always"), run, {}, record, workspace=tmp_path / "elsewhere")
    assert other == tracking.Destination(f"sqlite:///{tmp_path}/elsewhere/mlflow/mlflow.db", "tiny")
    given = tracking.destination(_cfg("tracking.mlflow_uri=sqlite:////tmp/other.db"), run, {}, record)
    assert given == tracking.Destination("sqlite:////tmp/other.db", "tiny")


def test_a_copied_run_directory_starts_an_mlflow_run_of_its_own(tmp_path):
    original, copy = tmp_path / "run", tmp_path / "copy"
    for folder in (original, copy):
        folder.mkdir()
        (folder / tracking.RECORD_FILE).write_text(json.dumps({"tracking_uri": "sqlite:////x.db", "run_id": "abc",
                                                               "run_dir": str(original), "events_offset": 10}))
    assert tracking.read_record(original)["run_id"] == "abc"
    assert tracking.read_record(copy) == {}
    (copy / tracking.RECORD_FILE).write_text("[1, 2]")
    assert tracking.read_record(copy) == {}


def test_a_job_retried_as_a_new_azure_ml_run_logs_into_the_new_one(tmp_path):
    record = {"tracking_uri": AZURE_ML["MLFLOW_TRACKING_URI"], "run_id": "job-run-0", "events_offset": 999}
    where = tracking.destination(_cfg(), tmp_path, AZURE_ML, record)
    assert where.run_id == "job-run-1" and where.events_offset == 0


def test_a_password_in_the_environments_uri_is_never_shown_or_recorded():
    assert tracking.redact("https://me:secret@host:5000/x") == "https://me:***@host:5000/x"
    assert tracking.redact("sqlite:////tmp/m.db") == "sqlite:////tmp/m.db"
    where = tracking.Destination("postgresql://me:secret@db/mlflow", "e")
    assert "secret" not in where.shown_uri


def test_params_are_the_flattened_config_with_long_values_cut_to_mlflows_limit():
    cfg = _cfg("model.lora.target_modules=qkv,proj")
    params = tracking.config_params({**cfg.to_dict(), "name": "n" * 50}, limit=40)
    assert params["train.max_steps"] == "40" and params["model.lora.target_modules"] == '["qkv", "proj"]'
    assert params["checkpoint.at_end"] == "true" and params["tracking.mlflow"] == "auto"
    assert len(params["name"]) == 40 and params["name"].endswith("... (50 characters: see config.yaml)")
    assert set(params) >= {f"{section}.{name}" for section in ("train", "optim", "tracking")
                           for name in getattr(config_mod, f"{section.capitalize()}Config").__dataclass_fields__}


def test_mlflow_and_tensorboard_take_an_events_scalars_by_the_same_names():
    train = TrainEvent(step=5, loss=2.0, lr=1e-3, tokens_per_s=100.0, data_wait_pct=1.0, mfu=0.1, elapsed_s=1.0,
                       peak_memory_mb=[10.0, 11.0])
    assert scalars(train) == {"train/loss": 2.0, "train/lr": 1e-3, "perf/tokens_per_s": 100.0, "perf/mfu": 0.1,
                              "perf/data_wait_pct": 1.0, "memory/peak_mb/rank0": 10.0, "memory/peak_mb/rank1": 11.0}
    assert scalars(EvalEvent(step=5, val_loss=3.0)) == {"eval/val_loss": 3.0}
    checkpoint = CheckpointEvent(step=10, lost_ms=5.0, blocking_ms=1.0, baseline_step_ms=None, path="p",
                                 persist_ms=9.0, bytes=100, deleted=[])
    assert scalars(checkpoint) == {"checkpoint/lost_ms": 5.0, "checkpoint/blocking_ms": 1.0,
                                   "checkpoint/persist_ms": 9.0, "checkpoint/bytes": 100}
    assert scalars(ProfileEvent(summary="s", traces=[], top_ops=[])) == {}


@pytest.mark.parametrize("override, message", [
    ("tracking.mlflow=true", "tracking.mlflow: True is not allowed; allowed: one of 'auto', 'always', 'never'"),
    ("tracking.mlflow_uri=/data/mlruns", "tracking.mlflow_uri: '/data/mlruns' is not a URI (a folder is MLflow's old "
                                         "file store, which MLflow 3 refuses: use sqlite:///FOLDER/mlflow.db); "
                                         "allowed: empty, or a tracking URI"),
    ("tracking.mlflow_uri=file:///data/mlruns", "tracking.mlflow_uri: 'file:///data/mlruns' is MLflow's old file "
                                                "store, which MLflow 3 refuses"),
    ("tracking.mlflow_uri=https://me:pw@mlflow.example:5000", "tracking.mlflow_uri: holds a password, and the config "
                                                              "is saved with the run"),
    ('tracking.experiment="a\\tb"', "tracking.experiment: 'a\\tb' is not allowed; allowed: empty, or printable text"),
    ("tracking.mlflow_uris=x", "tracking.mlflow_uris: unknown field; allowed: mlflow, mlflow_uri, experiment"),
])
def test_a_bad_tracking_field_is_refused_naming_it(override, message):
    with pytest.raises(config_mod.ConfigError) as caught:
        _cfg(override)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_tracking_uri_with_tracking_never_is_refused_as_a_contradiction():
    with pytest.raises(config_mod.ConfigError, match=r"^tracking.mlflow_uri: 'http://h:5000' is set while "
                                                     r"tracking.mlflow='never'; allowed: empty with "):
        _cfg("tracking.mlflow=never", "tracking.mlflow_uri=http://h:5000")
