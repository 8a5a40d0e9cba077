"""Where numbers go: events.jsonl (for widgets, the CLI and tests), TensorBoard scalars, status.json.

Only rank 0 has a MetricsSink; the other ranks contribute through all-reduces in the loop.
"""

from __future__ import annotations

import json
import os
import time

from toolkit.fsio import atomic_write_text
from toolkit.runs import status as run_status
from toolkit.runs.rundir import EventLog, RunDir

STATUS_EVERY_S = 2.0  # status.json is for people and supervisors: refreshing it faster buys nothing

# events.jsonl field -> TensorBoard tag
TRAIN_SCALARS = {"loss": "train/loss", "lr": "train/lr", "tokens_per_s": "perf/tokens_per_s",
                 "mfu": "perf/mfu", "data_wait_pct": "perf/data_wait_pct"}
EVAL_SCALARS = {"val_loss": "eval/val_loss", "val_bpb": "eval/val_bpb"}


class MetricsSink:
    def __init__(self, run: RunDir, cfg):
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only where scalars are written

        self.run = run
        self.events = EventLog(run.events_path)
        self.tb = SummaryWriter(log_dir=str(run.tb_dir))
        self._last_status = 0.0

    def start(self, lineage: dict, **facts) -> None:
        atomic_write_text(self.run.lineage_path, json.dumps(lineage, indent=1))
        # the MFU peak too: it is the run's denominator, and the machine's cached figure may change later
        run_status.transition(self.run, "start", pid=os.getpid(), started=time.time(),
                              peak_flops=facts.get("peak_flops"))
        self.events.emit("status", state="running", **facts)

    def train(self, step: int, **values) -> None:
        record = self.events.emit("train", step=step, **{k: _round(v) for k, v in values.items()})
        for key, tag in TRAIN_SCALARS.items():
            self.tb.add_scalar(tag, record[key], step)
        now = time.monotonic()
        if now - self._last_status >= STATUS_EVERY_S:
            run_status.update(self.run, step=step)
            self._last_status = now

    def eval(self, step: int, **values) -> None:
        self.events.emit("eval", step=step, **{k: _round(v) for k, v in values.items()})
        for key, tag in EVAL_SCALARS.items():
            if key in values:
                self.tb.add_scalar(tag, values[key], step)
        self.tb.flush()

    def checkpoint(self, step: int, **figures) -> None:
        """A checkpoint was published and the steps it slowed are over (called from the training thread).
        lost_ms is its cost; blocking_ms the part of it spent standing still."""
        record = self.events.emit("checkpoint", step=step, **{k: _round(v) for k, v in figures.items()})
        for key in ("lost_ms", "blocking_ms", "persist_ms", "bytes"):
            self.tb.add_scalar(f"checkpoint/{key}", record[key], step)

    def checkpoint_error(self, step: int, message: str) -> None:
        self.events.emit("checkpoint_error", step=step, message=message)

    def profile(self, summary: dict) -> None:
        self.events.emit("profile", **summary)

    def finish(self, result: dict) -> None:
        self.events.emit("status", state="completed", **result)
        run_status.transition(self.run, "complete", step=result["step"], ended=time.time())
        self.tb.flush()

    def fail(self, error: str) -> None:
        self.events.emit("error", message=error)
        run_status.transition(self.run, "fail", error=error, ended=time.time())

    def close(self) -> None:
        self.tb.close()
        self.events.close()


def _round(value):
    return round(value, 6) if isinstance(value, float) else value
