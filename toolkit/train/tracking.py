"""MLflow beside TensorBoard (tracking.mlflow): the run's metrics under TensorBoard's names, its config as params, tags
and its files, in one MLflow run.

Where they go (:func:`destination`):

    an Azure ML job       the job's own run: Azure ML sets MLFLOW_TRACKING_URI (azureml://...) and MLFLOW_RUN_ID, so
                          studio charts the metrics (the azureml scheme is azureml-mlflow's, in the `tracking` extra)
    tracking.mlflow_uri   that server or database
    locally (always)      sqlite:///WORKSPACE/mlflow/mlflow.db, artifacts in WORKSPACE/mlflow/artifacts: what
                          `mlflow ui --backend-store-uri sqlite:///WORKSPACE/mlflow/mlflow.db` opens (MLflow 3
                          refuses its old ./mlruns file store)

MLflow never slows or stops training. Its import and a store's start take seconds of CPU and a server may be slow or
gone, so none of it happens in the training process: rank 0 starts a follower process at low priority
(``python -m toolkit.train.tracking RUN_DIR``) that mirrors what the run directory says into MLflow, as a widget
would: each scalar of events.jsonl, config.yaml as params, the attempt's tags, and at the end the run's files and how
it ended. Rank 0 waits for it only at the run's end, for at most FINISH_TIMEOUT_S. The first thing that fails is
reported once (a tracking event, which rank 0 writes, and a line on stderr) and the follower leaves; TensorBoard and
events.jsonl go on.

A resumed or restarted run goes on in the same MLflow run: RUN_DIR/mlflow.json keeps its id and how far into
events.jsonl the follower got, so each event reaches MLflow once and each curve stays one line (a step trained again
after a resume is logged again, with the same value).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping

import yaml

from toolkit.checkpoint.store import flatten_config
from toolkit.fsio import atomic_write_text, read_regular_file
from toolkit.paths import SAFE_PATH_ENV
from toolkit.plain_data import RESOLVED_CONFIG_MAX_BYTES
from toolkit.events import ErrorEvent, EventLog, StatusEvent, TrackingEvent, read_new
from toolkit.rundir import RunDir
from toolkit.train.scalars import scalars

RECORD_FILE = "mlflow.json"  # in the run directory: the MLflow run its attempts log into, and how far they got
LOCAL_STORE = "mlflow"  # in the workspace: mlflow.db and artifacts/
FINISH_TIMEOUT_S = 60.0  # the most a run's end waits for MLflow (its import, a store's start, the last uploads)
POLL_S = 1.0  # how often the follower looks for new events: how late a chart is, at most
NICE = 19  # the follower's priority: it takes what CPU training leaves
# numpy's BLAS starts its thread pool on import, before the follower can lower its priority: one thread, no pool
FOLLOWER_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
END = "end"  # rank 0's last line to the follower: the attempt is over
BATCH = 1000  # MLflow's limit of metrics (and of entities) per log_batch
PARAMS_PER_BATCH = 100  # and of params, and of tags
# The run's files that go to MLflow at the end of each attempt (those that exist), under ARTIFACT_DIR
ARTIFACT_DIR = "trainbook"
ARTIFACTS = ("config.yaml", "lineage.json", "deepspeed_config.json", "events.jsonl")
# How an attempt ended (its last status event, or an error event) -> MLflow's name for it
END_STATUS = {"completed": "FINISHED", "stopped": "KILLED", "failed": "FAILED", "killed": "KILLED"}


@dataclass(frozen=True)
class Destination:
    """Where one attempt's MLflow logging goes."""

    uri: str
    """The tracking URI."""
    experiment: str
    """The experiment a new MLflow run is created in."""
    run_id: str | None = None
    """An MLflow run to log into: the Azure ML job's, or this run directory's from an earlier attempt; None: a new
    one."""
    job_run: bool = False
    """The run is the Azure ML job's, which Azure ML opens and ends (only logged into here)."""
    events_offset: int = 0
    """Bytes of events.jsonl that earlier attempts' followers sent to run_id already."""

    @property
    def shown_uri(self) -> str:
        return redact(self.uri)

    @property
    def artifact_root(self) -> Path | None:
        """A SQLite store's artifacts folder, beside its database: experiments created here keep their runs' files
        there, not in MLflow's default ./mlruns of whatever the current folder is."""
        if not self.uri.startswith("sqlite:///"):
            return None
        return Path(self.uri.removeprefix("sqlite:///")).parent / "artifacts"


def redact(uri: str) -> str:
    """``uri`` without a password (one from $MLFLOW_TRACKING_URI may hold one): what files and events show."""
    parts = urllib.parse.urlsplit(uri)
    if parts.password is None:
        return uri
    netloc = f"{parts.username}:***@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def local_store_uri(workspace: Path) -> str:
    return "sqlite:///" + str(Path(workspace).resolve() / LOCAL_STORE / "mlflow.db")


def read_record(run_path: Path) -> dict:
    """RUN_DIR/mlflow.json; {} when there is none, or when it is not a JSON object of this run directory's own (a
    copied run directory starts an MLflow run of its own: it forked)."""
    try:
        record = json.loads(read_regular_file(Path(run_path) / RECORD_FILE, field=RECORD_FILE, error=ValueError))
    except (OSError, ValueError):
        return {}
    if not isinstance(record, dict) or record.get("run_dir") != str(Path(run_path).resolve()):
        return {}
    return record


def destination(
    cfg, run_path: Path, env: Mapping[str, str], record: dict, workspace: Path | None = None
) -> Destination | None:
    """Where this attempt logs (see the module's table), or None when tracking.mlflow leaves MLflow out. ``record`` is
    :func:`read_record`'s; ``workspace`` the local store's (default: data.workspace, else the default workspace)."""
    t = cfg.tracking
    if t.mlflow == "never":
        return None
    experiment = t.experiment or cfg.name
    if t.mlflow_uri or env.get("MLFLOW_TRACKING_URI"):
        uri = t.mlflow_uri or env["MLFLOW_TRACKING_URI"]
        job_run = None if t.mlflow_uri else env.get("MLFLOW_RUN_ID")  # an Azure ML job (or whoever opened one)
    elif t.mlflow == "always":
        if workspace is None:
            from toolkit.catalogue.workspace import default_path

            workspace = Path(cfg.data.workspace or default_path())
        # never a store the record names: a copied run directory is data, and must not choose where anything is written
        uri, job_run = local_store_uri(workspace), None
    else:
        return None
    if record.get("tracking_uri") == redact(uri) and (job_run is None or record.get("run_id") == job_run):
        offset = record.get("events_offset")
        offset = offset if isinstance(offset, int) and offset >= 0 else 0
        return Destination(
            uri, experiment, run_id=record.get("run_id"), job_run=job_run is not None, events_offset=offset
        )
    return Destination(uri, experiment, run_id=job_run, job_run=job_run is not None)


_PARAM_KEY = re.compile(r"[^\w\-. /]")  # the characters MLflow refuses in a key


def config_params(config: dict, limit: int) -> dict[str, str]:
    """The resolved config as MLflow params: one per field, dotted names (``train.max_steps``), values as text (lists
    and mappings as JSON), a value longer than MLflow's ``limit`` cut to it with a note (config.yaml, an artifact of the
    run, holds it whole)."""
    params = {}
    for key, value in flatten_config(config).items():
        text = value if isinstance(value, str) else json.dumps(value)
        if len(text) > limit:
            note = f"... ({len(text):,} characters: see config.yaml)"
            text = text[: limit - len(note)] + note
        params[_PARAM_KEY.sub("_", key)] = text
    return params


def describe(exc: BaseException) -> str:
    """One line on what went wrong; a missing package names the extra that installs it."""
    if isinstance(exc, ModuleNotFoundError):
        from toolkit.extras import missing_extra_message

        found = missing_extra_message(exc, "tracking.mlflow")
        if found:
            return found
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:500]}" + ("..." if len(text) > 500 else "")


# --- rank 0's side -----------------------------------------------------------------------------------------------


class MlflowFollower:
    """The follower process of one attempt, seen from rank 0: started, told where to log (its stdin's first line),
    told that the attempt is over (an END line: not the pipe's end, which DataLoader workers forked later hold open
    too), waited for. Its reports (stdout, one JSON object a line) become tracking events here, the run's one writer
    of events.jsonl."""

    def __init__(self, run_path: Path, where: Destination, events: EventLog):
        self.where, self.events = where, events
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolkit.train.tracking", str(run_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **SAFE_PATH_ENV, **FOLLOWER_ENV},
        )
        # the destination goes through the pipe, not the command line: a URI from the environment may hold a password
        self.proc.stdin.write(json.dumps(dataclasses.asdict(where)) + "\n")
        self.proc.stdin.flush()
        self._relay = threading.Thread(target=self._relay_reports, name="mlflow-reports", daemon=True)
        self._relay.start()

    def _relay_reports(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.write(TrackingEvent(uri=self.where.shown_uri, **json.loads(line)))
            except (TypeError, ValueError):  # the event log was closed (the attempt is over: stderr has said it)
                return

    def end(self) -> None:
        """The attempt's last event is written: let the follower send the rest and end the MLflow run, and wait for it
        (at most FINISH_TIMEOUT_S; past that it is stopped and that is reported)."""
        try:
            self.proc.stdin.write(END + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # the follower left already (it reported why)
            pass
        self.close()
        training_priority(self.proc.pid)  # training is over: the follower's work is the run's last
        try:
            self.proc.wait(FINISH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            _report_here(self.where, self.events, f"its work was not done {FINISH_TIMEOUT_S:g} s after the run's end")
        self._relay.join()

    def close(self) -> None:
        """Let the follower go without waiting (once rank 0 and its DataLoader workers are gone, it sends what is left
        and leaves)."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:  # the follower left already (it reported why)
            pass


def start_follower(run_path: Path, cfg, events: EventLog, env: Mapping[str, str]) -> MlflowFollower | None:
    """Rank 0's MLflow follower for this attempt, or None when tracking.mlflow leaves MLflow out here (or it could not
    be started: reported)."""
    where = destination(cfg, run_path, env, read_record(run_path))
    if where is None:
        return None
    try:
        return MlflowFollower(run_path, where, events)
    except OSError as exc:  # no process to be had (memory, limits): training goes on without MLflow
        _report_here(where, events, describe(exc))
        return None


def failure_line(where: Destination, reason: str) -> str:
    """What stderr says, once, when MLflow tracking stops."""
    return f"MLflow tracking ({where.shown_uri}) stopped, training goes on (TensorBoard, events.jsonl): {reason}"


def _report_here(where: Destination, events: EventLog, reason: str) -> None:
    """A failure rank 0 saw itself: stderr and a tracking event."""
    print(failure_line(where, reason), file=sys.stderr, flush=True)
    events.write(TrackingEvent(state="failed", uri=where.shown_uri, message=reason))


# --- the follower process ------------------------------------------------------------------------------------------


class Mirror:
    """Sends what a run directory says to one MLflow run (the follower process's work)."""

    def __init__(self, run: RunDir, where: Destination):
        self.run, self.where = run, where
        self.offset = where.events_offset
        self.run_id = where.run_id
        self.ended_as: str | None = None  # how the newest attempt seen in the events ended, if it did

    def open(self) -> None:
        from mlflow.entities import Param
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        if self.where.artifact_root is not None:
            self.where.artifact_root.mkdir(parents=True, exist_ok=True)  # and the database's folder with it
        self.client = client = MlflowClient(tracking_uri=self.where.uri)
        logged: dict = {}
        if self.run_id is not None:
            try:
                logged = client.get_run(self.run_id).data.params
            except MlflowException as exc:
                if self.where.job_run or exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                self.run_id, self.offset = None, 0  # the store lost it (deleted, a new database): a new MLflow run
        if self.run_id is None:
            self.run_id = client.create_run(self._experiment_id(), run_name=self.run.path.name).info.run_id
        elif not self.where.job_run:
            client.update_run(self.run_id, status="RUNNING")  # reopened: a stop or a failure had ended it
        self._save_record()
        # params are write-once in MLflow: a resume logs only those the run lacks (train.max_steps may have grown; the
        # config.yaml artifact holds the values each attempt ran with)
        self.config = yaml.safe_load(
            read_regular_file(
                self.run.config_path, field="config.yaml", error=ValueError, limit=RESOLVED_CONFIG_MAX_BYTES
            )
        )
        new = [Param(k, v) for k, v in config_params(self.config, MAX_PARAM_VAL_LENGTH).items() if k not in logged]
        for i in range(0, len(new), PARAMS_PER_BATCH):
            client.log_batch(self.run_id, params=new[i : i + PARAMS_PER_BATCH])
        hint = f"mlflow ui --backend-store-uri {self.where.shown_uri}" if self.where.artifact_root else None
        report({"state": "logging", "run_id": self.run_id, "message": hint})

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(self.where.experiment)
        if found is not None:
            return found.experiment_id
        root = self.where.artifact_root
        try:
            return self.client.create_experiment(
                self.where.experiment, artifact_location=root.as_uri() if root else None
            )
        except MlflowException:  # another run created it meanwhile
            found = self.client.get_experiment_by_name(self.where.experiment)
            if found is None:
                raise
            return found.experiment_id

    def _save_record(self) -> None:
        atomic_write_text(
            self.run.path / RECORD_FILE,
            json.dumps(
                {
                    "tracking_uri": self.where.shown_uri,
                    "run_id": self.run_id,
                    "run_dir": str(self.run.path.resolve()),
                    "events_offset": self.offset,
                }
            ),
        )

    def send_new_events(self) -> None:
        """Every event appended since the last call: its scalars as metrics (the names TensorBoard shows them by),
        an attempt's start as tags."""
        from mlflow.entities import Metric

        events, end = read_new(self.run.events_path, self.offset)
        metrics = []
        for event in events:
            ms = int((event.time or 0) * 1000)
            metrics += [Metric(name, value, ms, event.step) for name, value in scalars(event).items()]
            if isinstance(event, StatusEvent) and event.state == "running":
                self.ended_as = None
                self._tag_attempt(event)
            elif isinstance(event, StatusEvent) and event.state in END_STATUS:
                self.ended_as = event.state
            elif isinstance(event, ErrorEvent):
                self.ended_as = "failed"
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH])
        if end != self.offset:
            self.offset = end
            self._save_record()

    def _tag_attempt(self, event: StatusEvent) -> None:
        from mlflow.entities import RunTag

        lineage = self.run.read_lineage()
        tags = {
            "trainbook.run_dir": str(self.run.path.resolve()),
            "trainbook.attempt": event.attempt or 0,
            "trainbook.config_sha256": lineage.get("config_sha256"),
            "trainbook.world_size": lineage.get("world_size"),
            "trainbook.engine": (self.config.get("engine") or {}).get("name"),
        }
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if v is not None])

    def finish(self) -> None:
        """Rank 0 is done: what is left goes to the run; when the events say how the attempt ended, its files go too and
        the run ends the same way (an Azure ML job's run is Azure ML's to end); otherwise it stays open."""
        self.send_new_events()
        if self.ended_as is None:
            return
        for name in ARTIFACTS:
            if (self.run.path / name).is_file():
                self.client.log_artifact(self.run_id, str(self.run.path / name), artifact_path=ARTIFACT_DIR)
        if not self.where.job_run:
            self.client.set_terminated(self.run_id, status=END_STATUS[self.ended_as])


def report(fields: dict) -> None:
    """One report to rank 0 (which writes it as a tracking event)."""
    print(json.dumps(fields), flush=True)


def lowest_priority() -> None:
    """Take only CPU that training leaves idle: SCHED_IDLE where Linux offers it (measured by bench/bench_mlflow.py:
    at nice 19 alone, the follower's ~4 CPU-s over a 30 s run on 2 busy cores still cost training ~5%), else nice.
    Linux sets the calling thread's policy; threads started later inherit it (the follower's own; the BLAS pool its
    imports may start is held to one thread by FOLLOWER_ENV)."""
    os.nice(NICE)
    if hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
        with contextlib.suppress(OSError):  # a container may refuse it: nice stays
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def training_priority(pid: int) -> None:
    """Give process ``pid`` (the follower: its main thread, which does the work) a normal policy and this process's
    priority back, each where allowed. Leaving SCHED_IDLE takes RLIMIT_NICE >= 1 or CAP_SYS_NICE, raising the priority
    past nice 19 more; without them the follower finishes idle-only, which a finished run's machine mostly is."""
    with contextlib.suppress(OSError):  # not allowed, or the follower is gone
        if hasattr(os, "sched_setscheduler"):
            os.sched_setscheduler(pid, os.SCHED_OTHER, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0))


def follow(run_dir: str) -> int:
    """The follower process: read the destination, mirror the run until rank 0 says END (or is gone), finish."""
    lowest_priority()
    where = Destination(**json.loads(sys.stdin.readline()))
    over = threading.Event()

    def wait_for_the_end():
        sys.stdin.readline()  # END, or "" when rank 0 is gone without a word
        over.set()

    threading.Thread(target=wait_for_the_end, daemon=True).start()
    mirror = None
    try:
        import logging

        import mlflow  # noqa: F401 - seconds of import, here rather than in training

        # MLflow and alembic narrate a new store's migrations at INFO, into the run's log
        for name in ("mlflow", "alembic"):
            logging.getLogger(name).setLevel(logging.WARNING)
        mirror = Mirror(RunDir(run_dir), where)
        mirror.open()
        while not over.wait(POLL_S):
            mirror.send_new_events()
        mirror.finish()
        return 0
    except Exception as exc:  # noqa: BLE001 - whatever MLflow raises, training goes on
        reason = describe(exc)
        print(failure_line(where, reason), file=sys.stderr, flush=True)
        report({"state": "failed", "run_id": mirror.run_id if mirror else where.run_id, "message": reason})
        return 1


if __name__ == "__main__":
    sys.exit(follow(sys.argv[1]))
