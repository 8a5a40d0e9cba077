"""Where numbers go: events.jsonl (for widgets, the CLI and tests), TensorBoard scalars (toolkit.train.scalars names
them), status.json; with tracking.mlflow, a follower process that mirrors them into MLflow (toolkit.train.tracking).

Only rank 0 has a MetricsSink; the other ranks contribute through all-reduces in the loop.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from toolkit.fsio import atomic_write_text
from toolkit import status as run_status
from toolkit.events import (
    CheckpointErrorEvent,
    CheckpointEvent,
    CompileEvent,
    ErrorEvent,
    EvalEvent,
    EventLog,
    ProfileEvent,
    StatusEvent,
    TrainEvent,
)
from toolkit.rundir import RunDir
from toolkit.train import tracking
from toolkit.train.scalars import scalars

STATUS_EVERY_S = 2.0  # status.json is for people and supervisors: refreshing it faster buys nothing


class MetricsSink:
    def __init__(self, run: RunDir, cfg):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only where scalars are written

        self.run = run
        self.events = EventLog(run.events_path)
        self.tb = SummaryWriter(log_dir=str(run.tb_dir))
        # started now, so that MLflow's start (seconds of import, a store to open) is behind it by the first step
        self.mlflow = tracking.start_follower(run.path, cfg, self.events, os.environ)
        self._last_status = 0.0

    def start(self, lineage: dict, **facts) -> None:
        atomic_write_text(self.run.lineage_path, json.dumps(lineage, indent=1))
        # the MFU peak too: it is the run's denominator, and the machine's cached figure may change later
        run_status.transition(
            self.run,
            "start",
            pid=os.getpid(),
            started=time.time(),
            peak_flops=facts.get("peak_flops"),
            peak_source=facts.get("peak_source"),
        )
        self.events.write(StatusEvent(state="running", **facts))

    def _write_scalars(self, event) -> None:
        for tag, value in scalars(event).items():
            self.tb.add_scalar(tag, value, event.step)

    def train(self, step: int, **values) -> None:
        self._write_scalars(self.events.write(TrainEvent(step=step, **{k: _round(v) for k, v in values.items()})))
        now = time.monotonic()
        if now - self._last_status >= STATUS_EVERY_S:
            run_status.update(self.run, step=step)
            self._last_status = now

    def eval(self, step: int, **values) -> None:
        self._write_scalars(self.events.write(EvalEvent(step=step, **{k: _round(v) for k, v in values.items()})))
        self.tb.flush()

    def checkpoint(self, step: int, **figures) -> None:
        """A checkpoint was published and the steps it slowed are over (called from the training thread).
        lost_ms is its cost; blocking_ms the part of it spent standing still."""
        self._write_scalars(self.events.write(CheckpointEvent(step=step, **{k: _round(v) for k, v in figures.items()})))

    def compile(self, **fields) -> None:
        """train.compile: graphs compiled since the last such event (toolkit.train.compilation)."""
        self.events.write(CompileEvent(**fields))

    def checkpoint_error(self, step: int, message: str) -> None:
        self.events.write(CheckpointErrorEvent(step=step, message=message))

    def profile(self, summary: dict) -> None:
        self.events.write(ProfileEvent(**summary))

    def finish(self, result: dict, stopped: bool = False) -> None:
        """The run's end: completed, or stopped on request after its last checkpoint (a resume continues it)."""
        state, transition = ("stopped", "stop") if stopped else ("completed", "complete")
        self.events.write(StatusEvent(state=state, **result))
        run_status.transition(self.run, transition, step=result["step"], ended=time.time())
        self.tb.flush()
        self._end_mlflow()

    def fail(self, error: str) -> None:
        self.events.write(ErrorEvent(message=error))
        try:
            run_status.transition(self.run, "fail", error=error, ended=time.time())
        finally:  # an end recorded meanwhile (IllegalTransition) stands; the MLflow run still ends as failed
            self._end_mlflow()

    def _end_mlflow(self) -> None:
        """After the attempt's last event: MLflow gets the rest, the run's files and how it ended."""
        if self.mlflow:
            self.mlflow.end()

    def close(self) -> None:
        self.tb.close()
        if self.mlflow:
            self.mlflow.close()
        self.events.close()


def _round(value):
    return round(value, 6) if isinstance(value, float) else value


@dataclass(frozen=True)
class SteadyState:
    """A run's speed once start-up is behind it."""

    tokens_per_s: float
    """Mean of the logged intervals' tokens per second."""
    mfu: float
    """Mean model FLOPs utilisation, 0..1."""
    data_wait_pct_max: float
    """The worst interval's share of time spent waiting for data, percent."""
    intervals: int
    """How many logged intervals the figures average."""


def steady_state(train: list[TrainEvent]) -> SteadyState | None:
    """The figures of the second half of a run's logged intervals: the first half holds start-up (the first
    steps' allocations and warm-up, the first checkpoint) and would understate a long run's speed."""
    tail = train[len(train) // 2 :]
    if not tail:
        return None
    return SteadyState(
        tokens_per_s=sum(e.tokens_per_s for e in tail) / len(tail),
        mfu=sum(e.mfu for e in tail) / len(tail),
        data_wait_pct_max=max(e.data_wait_pct for e in tail),
        intervals=len(tail),
    )
