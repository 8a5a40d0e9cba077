"""The schema of events.jsonl: one dataclass per kind of event, its one writer and its readers.

On disk each event is one JSON object a line, ``{"event": <kind>, "time": <epoch s>, <field>: <value>, ...}``,
appended and flushed as it happens. Readers tolerate what other versions write: a line of a kind this version
does not know is passed over, keys it does not know are ignored, and fields added since a run was recorded
are optional. A line that is not an event at all (not JSON, or a known kind without a required field) is
skipped with a warning naming the file and its byte offset, so one bad line never stops a panel or a report.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
import time as time_mod
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from toolkit.errors import RefusedValue, not_allowed, refused
from toolkit.fsio import open_log, open_regular_file
from toolkit.plain_data import loads_json

EVENTS_FILE = "events.jsonl"


def _field(doc: str, *, optional: bool = False, null: bool = False):
    """A field and its one-line description. ``optional``: absent from older runs or from some writers, left
    out of the line when None. ``null``: always written, None (JSON null) included."""
    metadata = {"doc": doc, "omit_if_none": optional}
    return (
        dataclasses.field(default=None, metadata=metadata) if optional or null else dataclasses.field(metadata=metadata)
    )


@dataclass(kw_only=True)
class Event:
    kind: ClassVar[str]
    time: float | None = _field("seconds since the epoch when it was written (the writer sets it)", optional=True)


@dataclass(kw_only=True)
class StatusEvent(Event):
    """The run's state changed: running (rank 0 started), completed (rank 0 finished), failed, stopped or
    killed (written by the supervisor or the launcher when the ranks died without saying so)."""

    kind: ClassVar[str] = "status"
    state: str = _field("queued, running, completed, failed, stopped or killed (see toolkit.status)")
    n_params: int | None = _field("running: the model's parameter count", optional=True)
    n_trainable: int | None = _field("running: how many of them train (fewer with LoRA)", optional=True)
    flops_per_item: float | None = _field("running: training FLOPs per token (or sample)", optional=True)
    flops_source: str | None = _field(
        "running: where flops_per_item comes from (a formula, the config, or an estimate of 6 x parameters)",
        optional=True,
    )
    peak_flops: float | None = _field("running: this device's peak FLOP/s, the denominator of MFU", optional=True)
    peak_source: str | None = _field(
        "running: where peak_flops comes from: 'datasheet' (a known GPU in bf16/fp16) or "
        "'measured' (a matmul on this device)",
        optional=True,
    )
    bytes_per_token: float | None = _field(
        "running: bytes of text per token of the run's data (1 for bytes, more with a BPE tokenizer); a loss in nats "
        "per token / (ln 2 x this) is bits per byte. Absent for data that is not text",
        optional=True,
    )
    dropped_examples: str | None = _field(
        "running: examples of the data left out, in words (conversations with no assistant token within the "
        "context); absent when none were",
        optional=True,
    )
    attempt: int | None = _field("running: 0 for the first start, +1 per restart or resume", optional=True)
    resumed_from: str | None = _field("running: the checkpoint this attempt resumed from", optional=True)
    resumed_step: int | None = _field("running: the step that checkpoint was taken at", optional=True)
    step: int | None = _field("completed: the last optimizer step", optional=True)
    train_seconds: float | None = _field("completed: training time, evaluation excluded", optional=True)
    val_loss: float | None = _field("completed: the final validation loss (nats)", optional=True)
    val_bpb: float | None = _field("completed: the final validation bits per byte (byte data only)", optional=True)
    peak_memory_mb: float | None = _field(
        "completed: rank 0's peak memory, MiB (GPU: max allocated; CPU: max resident set of the process)", optional=True
    )
    exit_code: int | None = _field("written by the supervisor or launcher: the process's exit code", optional=True)
    reason: str | None = _field("written by the supervisor or launcher: the exit code in words", optional=True)


@dataclass(kw_only=True)
class TrainEvent(Event):
    """One log interval of training (every train.log_every steps, and the last step)."""

    kind: ClassVar[str] = "train"
    step: int = _field("optimizer steps completed")
    loss: float = _field("mean training loss over the interval, all ranks (nats)")
    lr: float = _field("the learning rate of the interval's last step")
    tokens_per_s: float = _field("items (tokens, or samples for tables) per second, all ranks")
    data_wait_pct: float = _field("share of the interval spent waiting for batches, percent")
    mfu: float = _field("model FLOPs utilisation, 0..1")
    elapsed_s: float = _field("training time so far, agreed between ranks (evaluation excluded)")
    horizon: int | None = _field("the step the LR schedule ends at (moves under a time budget)", optional=True)
    peak_memory_mb: list[float] | None = _field(
        "each rank's peak memory so far, MiB, in rank order (GPU: max allocated; CPU: peak resident set)", optional=True
    )
    loss_scale: float | None = _field("fp16: the dynamic loss scale at the interval's end", optional=True)
    skipped_steps: int | None = _field("fp16: optimizer steps skipped so far for inf/NaN gradients", optional=True)
    nonfinite_skipped: int | None = _field(
        "watchdog.nonfinite=skip: steps whose update was skipped so far for a non-finite loss or gradients",
        optional=True,
    )
    # train.objective=dpo, means over the interval's pairs (TRL's rewards/* and logps/*)
    chosen_reward: float | None = _field("DPO: beta x the chosen answers' log-ratio to the reference", optional=True)
    rejected_reward: float | None = _field(
        "DPO: beta x the rejected answers' log-ratio to the reference", optional=True
    )
    reward_margin: float | None = _field("DPO: chosen_reward - rejected_reward", optional=True)
    reward_accuracy: float | None = _field("DPO: share of pairs whose chosen reward is the higher, 0..1", optional=True)
    chosen_logps: float | None = _field("DPO: the policy's log-probability of the chosen answers", optional=True)
    rejected_logps: float | None = _field("DPO: the policy's log-probability of the rejected answers", optional=True)


@dataclass(kw_only=True)
class EvalEvent(Event):
    """A validation pass."""

    kind: ClassVar[str] = "eval"
    step: int = _field("the step it was evaluated at")
    val_loss: float = _field("mean validation loss (nats)")
    val_bpb: float | None = _field("validation bits per byte (byte data only)", optional=True)
    # train.objective=dpo: the train event's figures over the validation pairs
    val_chosen_reward: float | None = _field("DPO: see TrainEvent.chosen_reward", optional=True)
    val_rejected_reward: float | None = _field("DPO: see TrainEvent.rejected_reward", optional=True)
    val_reward_margin: float | None = _field("DPO: see TrainEvent.reward_margin", optional=True)
    val_reward_accuracy: float | None = _field("DPO: see TrainEvent.reward_accuracy", optional=True)
    val_chosen_logps: float | None = _field("DPO: see TrainEvent.chosen_logps", optional=True)
    val_rejected_logps: float | None = _field("DPO: see TrainEvent.rejected_logps", optional=True)

    @property
    def headline(self) -> float:
        """What the pass is shown as: bits per byte where the data is bytes, the loss otherwise."""
        return self.val_loss if self.val_bpb is None else self.val_bpb


# a checkpoint's wait for the previous write this long is told once: the interval outruns the disk
WAITED_NOTICE_MS = 10.0


@dataclass(kw_only=True)
class CheckpointEvent(Event):
    """A checkpoint was published and the steps its write slowed are over: what it cost."""

    kind: ClassVar[str] = "checkpoint"
    step: int = _field("the step it holds")
    lost_ms: float | None = _field(
        "training time it lost, blocking plus slowed steps (runs since lost_ms)", optional=True
    )
    blocking_ms: float = _field("training time spent standing still for it, milliseconds")
    waited_ms: float | None = _field(
        "of blocking_ms, the wait for the previous checkpoint's write to finish (one is "
        "written at a time; runs since waited_ms)",
        optional=True,
    )
    window_steps: int | None = _field("steps its cost was measured over (runs since lost_ms)", optional=True)
    baseline_step_ms: float | None = _field(
        "the undisturbed step time it was compared with; null when unknown", null=True
    )
    path: str = _field("the published checkpoint folder")
    persist_ms: float = _field("from its start to its publication, milliseconds")
    bytes: int = _field("its size on disk")
    deleted: list = _field("checkpoint names retention removed when it was published")

    @property
    def waited_notice(self) -> str | None:
        """One line for people when it waited for the previous write long enough to matter, else None."""
        if (self.waited_ms or 0) < WAITED_NOTICE_MS:
            return None
        return (
            f"checkpoint at step {self.step} waited {self.waited_ms:.0f} ms for the previous one's write "
            f"({self.persist_ms:.0f} ms each): checkpoints come faster than they are written; space them out "
            f"(checkpoint.every_steps, checkpoint.every_seconds), or ask `trainbook advise RUN_DIR`"
        )


@dataclass(kw_only=True)
class CheckpointErrorEvent(Event):
    """A checkpoint could not be written; training goes on."""

    kind: ClassVar[str] = "checkpoint_error"
    step: int = _field("the step whose checkpoint failed")
    message: str = _field("what went wrong")


@dataclass(kw_only=True)
class CheckpointInvalidEvent(Event):
    """At start-up, a checkpoint failed verification and an older one is tried."""

    kind: ClassVar[str] = "checkpoint_invalid"
    checkpoint: str = _field("the checkpoint's folder name")
    reason: str = _field("why it is not usable")


@dataclass(kw_only=True)
class ProfileEvent(Event):
    """The profiler's active steps are over and its traces are written."""

    kind: ClassVar[str] = "profile"
    summary: str = _field("path of the operator table (summary.txt)")
    traces: list = _field("trace file names in the profile folder")
    top_ops: list = _field("the five most expensive operators: {name, self_cpu_ms, calls}")


@dataclass(kw_only=True)
class ErrorEvent(Event):
    """Training failed with an exception (rank 0, or the worker when it failed before training started)."""

    kind: ClassVar[str] = "error"
    message: str = _field("the exception type and message")


@dataclass(kw_only=True)
class RestartEvent(Event):
    """The supervisor restarts training after it died."""

    kind: ClassVar[str] = "restart"
    restart: int = _field("restarts by this supervisor so far, this one included")
    attempt: int = _field("the attempt number the restart starts")
    reason: str = _field("how training died")
    from_step: int = _field("the step training restarts from (0: no checkpoint)")
    checkpoint: str | None = _field("the checkpoint it restarts from; null when none", null=True)
    skipped: list = _field("newer checkpoints that failed verification")


@dataclass(kw_only=True)
class DebuggerEvent(Event):
    """Rank 0 listens for a debugger (debug.enabled; toolkit.runs.debugging), or one has attached."""

    kind: ClassVar[str] = "debugger"
    state: str = _field("waiting (training holds until a client attaches), listening (training goes on) or attached")
    host: str = _field("the loopback address debugpy listens on")
    port: int = _field("the TCP port debugpy listens on")
    world_size: int = _field("processes in the run: the ranks other than 0 wait in their first collective")
    attempt: int | None = _field("the attempt (0 first, +1 per restart or resume) that listens", optional=True)


@dataclass(kw_only=True)
class NonFiniteEvent(Event):
    """A step's loss or gradients were not finite on some rank, so its update was not applied (toolkit.train.watchdog):
    the step was skipped (watchdog.nonfinite=skip) or the run stopped after checkpointing the state before it."""

    kind: ClassVar[str] = "nonfinite"
    step: int = _field("the step whose update was not applied")
    loss: str = _field(
        "that step's loss over all ranks, as text (JSON has no NaN): 'nan', 'inf', or a number when "
        "only the gradients were not finite"
    )
    ranks: list = _field("the ranks whose own loss was not finite; empty when only the gradients were not")
    action: str = _field("skipped (training went on) or stopped (the run failed after the checkpoint)")
    skipped: int = _field("steps skipped so far in the run, this one included when it was skipped")
    in_a_row: int = _field("non-finite steps in a row, this one included")
    checkpoint: str | None = _field(
        "stopped: the checkpoint holding the state before this step; absent when none could be written", optional=True
    )

    @property
    def summary(self) -> str:
        """One line for people: the job log, the CLI, the panel."""
        where = (
            f" (not finite on rank {', '.join(map(str, self.ranks))})"
            if self.ranks
            else " (finite; its gradients were not)"
        )
        head = f"step {self.step}: loss {self.loss}{where}, update not applied"
        if self.action == "skipped":
            return f"{head}; skipped ({self.skipped} so far, {self.in_a_row} in a row)"
        saved = (
            f"checkpoint {self.checkpoint} holds the state before it"
            if self.checkpoint
            else "no checkpoint of the state before it could be written"
        )
        in_a_row = f" ({self.in_a_row} in a row)" if self.in_a_row > 1 else ""
        return f"{head}; the run stops{in_a_row}: {saved}"


@dataclass(kw_only=True)
class HangEvent(Event):
    """No progress within the watchdog's limit (toolkit.train.watchdog): every rank dumps its threads' Python stacks,
    then the training processes are ended for the supervisor to restart (written by rank 0's watchdog)."""

    kind: ClassVar[str] = "hang"
    step: int = _field("the last step completed")
    phase: str = _field("what was under way: start, step, evaluation, checkpoint or final checkpoint")
    waited_s: float = _field("seconds without progress when the hang was declared")
    limit_s: float = _field(
        "the limit passed: watchdog.hang_factor x the recent step (or phase) time, at least "
        "hang_min_seconds, or hang_allowance_seconds where there was no such time yet"
    )
    stacks: str = _field("the folder of the stack dumps, rank_<r>.txt for each rank")
    attempt: int = _field("the attempt that hung (0 first, +1 per restart or resume)")

    @property
    def summary(self) -> str:
        """One line for people: the job log, the CLI, the panel."""
        return (
            f"hang after step {self.step} (in {self.phase}): no progress for {self.waited_s:.0f} s (limit "
            f"{self.limit_s:.0f} s); Python stacks of every rank in {self.stacks}"
        )


@dataclass(kw_only=True)
class TrackingEvent(Event):
    """MLflow takes the run's metrics (toolkit.train.tracking), or stopped taking them: training goes on either way,
    with TensorBoard and this file."""

    kind: ClassVar[str] = "tracking"
    state: str = _field("logging (the MLflow run is open) or failed (MLflow is left alone for the rest of the attempt)")
    uri: str = _field("the MLflow tracking URI (a password in it left out)")
    run_id: str | None = _field("logging: the MLflow run's id", optional=True)
    message: str | None = _field("failed: what went wrong; logging: how to look at it", optional=True)


@dataclass(kw_only=True)
class CompileEvent(Event):
    """train.compile: torch.compile compiled (or recompiled) graphs of the model since the last such event
    (toolkit.train.compilation): how long it took and, for a recompilation, dynamo's reason."""

    kind: ClassVar[str] = "compile"
    step: int = _field(
        "the step during or before which it compiled (a compile in an evaluation counts for the step after it)"
    )
    seconds: float = _field("compile time: dynamo, AOTAutograd and the backend, forward and backward graphs")
    graphs: int = _field("forward graphs compiled (each with its backward when it trains)")
    recompiles: int = _field("of those, recompilations of code compiled before (a new batch shape, no_grad, ...)")
    reasons: list = _field(
        "each recompilation's reason, as dynamo gives it ('FUNCTION: GUARD FAILURE'), and any "
        "compile that failed and ran eagerly"
    )
    graph_breaks: int = _field("graph breaks in the graphs compiled: code dynamo left to Python")

    @property
    def summary(self) -> str:
        """One line for people: the CLI, the panel."""
        what = "recompiled" if self.recompiles else "compiled"
        breaks = f", {self.graph_breaks} graph breaks" if self.graph_breaks else ""
        head = (
            f"{what} {self.graphs} graph{'s' if self.graphs != 1 else ''} in {self.seconds:.1f} s at step "
            f"{self.step}{breaks}"
        )
        return head + (f": {'; '.join(self.reasons)}" if self.reasons else "")


KINDS: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        StatusEvent,
        TrainEvent,
        EvalEvent,
        CheckpointEvent,
        CheckpointErrorEvent,
        CheckpointInvalidEvent,
        ProfileEvent,
        ErrorEvent,
        RestartEvent,
        DebuggerEvent,
        NonFiniteEvent,
        HangEvent,
        TrackingEvent,
        CompileEvent,
    )
}
E = TypeVar("E", bound=Event)


# --- the format ---------------------------------------------------------------------------------------------------


def to_record(event: Event) -> dict:
    """The JSON object of one line: "event" and "time" first, then the fields (optional ones only when set)."""
    record = {"event": event.kind, "time": event.time}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if f.name != "time" and not (value is None and f.metadata["omit_if_none"]):
            record[f.name] = value
    return record


# What a field's annotation allows of a value read from a line (JSON gives no other types): a copied run's file may
# hold a string where a reader does arithmetic
_TYPE_CHECKS = {
    float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    str: lambda v: isinstance(v, str),
    list: lambda v: isinstance(v, list),
}
_TYPE_NAMES = {float: "a number", int: "an integer", str: "a string", list: "a list"}


@functools.cache
def _field_types(cls: type) -> dict[str, tuple[type, bool]]:
    """Each field of an event class: (the type _TYPE_CHECKS knows it by, whether None is allowed too)."""
    hints = typing.get_type_hints(cls)
    types = {}
    for field in dataclasses.fields(cls):
        args = typing.get_args(hints[field.name])
        optional = type(None) in args
        kind = next((a for a in args if a is not type(None)), hints[field.name]) if optional else hints[field.name]
        types[field.name] = (typing.get_origin(kind) or kind, optional)
    return types


def from_record(record: dict) -> Event | None:
    """The event a line's object holds; None for a kind this version does not know. Keys it does not know are
    ignored. Raises ValueError when the object is not an event (no kind, a required field missing)."""
    kind = record.get("event")
    if not isinstance(kind, str):
        raise ValueError(not_allowed("'event'", kind, "the event's kind, a string"))
    cls = KINDS.get(kind)
    if cls is None:
        return None
    types = _field_types(cls)
    fields = {k: v for k, v in record.items() if k in types}
    for name, value in fields.items():
        allowed, optional = types[name]
        if not (value is None and optional) and not _TYPE_CHECKS[allowed](value):
            raise ValueError(not_allowed(f"'{name}'", value, _TYPE_NAMES[allowed]))
    try:
        return cls(**fields)
    except TypeError as exc:  # the dataclass names the missing field
        raise ValueError(f"a {kind} event: {exc}") from None


class EventLog:
    """The one writer: appends each event as one JSON line and flushes it, so a reader tailing the file sees it
    at once."""

    def __init__(self, path: Path):
        self._file = open_log(Path(path), text=True)  # line-buffered: each event reaches the OS as it is written
        self._lock = threading.Lock()  # the checkpoint thread writes events too

    def write(self, event: E) -> E:
        """Append ``event`` (stamped with the time now when it has none); return it as written."""
        if event.time is None:
            event = dataclasses.replace(event, time=round(time_mod.time(), 3))
        line = json.dumps(to_record(event)) + "\n"
        with self._lock:
            self._file.write(line)
        return event

    def close(self) -> None:
        self._file.close()


def append_event(path: Path, event: E) -> E:
    """One event from a process other than rank 0 (worker start-up failure, supervisor, launcher), written when
    no rank is writing: before training starts or after the ranks have died."""
    log = EventLog(path)
    try:
        return log.write(event)
    finally:
        log.close()


# --- reading ------------------------------------------------------------------------------------------------------


# An event is a few hundred bytes (a compile event naming its recompilations the longest); a longer line is not one,
# and is skipped without being held in memory whole (a copied run's file may be anything)
MAX_LINE_BYTES = 1 << 20


def read_records(path: Path, offset: int = 0) -> tuple[list[dict], int]:
    """The JSON objects of the lines appended since byte ``offset``, and the offset to continue from.

    A last line without its newline is being written right now: it is left for the next call. A line that is
    not a JSON object, or is over MAX_LINE_BYTES, is skipped with a warning. The file must be the run's own
    regular file (a link or a FIFO in a copied run is refused, naming it).
    """
    try:
        f = open_regular_file(path, field=EVENTS_FILE, error=RefusedValue)
    except FileNotFoundError:
        return [], offset
    records, at = [], offset
    with f:
        f.seek(offset)
        while line := f.readline(MAX_LINE_BYTES + 1):
            length = len(line)
            if length > MAX_LINE_BYTES:  # read past the rest of it, a piece at a time
                while line and not line.endswith(b"\n"):
                    line = f.readline(MAX_LINE_BYTES)
                    length += len(line)
                if not line:  # no newline yet: still being written
                    break
                _skipped(path, at, ValueError(f"over {MAX_LINE_BYTES:,} bytes"))
            elif not line.endswith(b"\n"):  # still being written
                break
            elif (record := _record_or_none(path, at, line)) is not None:
                records.append(record)
            at += length
    return records, at


def _record_or_none(path: Path, at: int, line: bytes) -> dict | None:
    try:
        record = loads_json(line) if line.strip() else None
        if record is not None and not isinstance(record, dict):
            raise ValueError(refused(None, f"a JSON {type(record).__name__}", "a JSON object"))
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and PlainDataError are ValueErrors
        _skipped(path, at, exc)
        return None
    return record


def read_new(path: Path, offset: int = 0) -> tuple[list[Event], int]:
    """The events appended since byte ``offset`` (what a follower polls), and the offset to continue from."""
    records, end = read_records(path, offset)
    events = [_event_or_none(path, r) for r in records]
    return [e for e in events if e is not None], end


def read_events(run_dir, kind: type[E] | None = None) -> list[E]:
    """Every event of a run directory (a path or a RunDir) in the order written; only ``kind``'s when given,
    e.g. ``read_events(run, TrainEvent)``."""
    if kind is not None and KINDS.get(getattr(kind, "kind", None)) is not kind:
        raise ValueError(not_allowed("kind", kind, f"one of {', '.join(c.__name__ for c in KINDS.values())}"))
    path = Path(getattr(run_dir, "path", run_dir)) / EVENTS_FILE
    events, _ = read_new(path)
    return [e for e in events if kind is None or isinstance(e, kind)]


def _event_or_none(path: Path, record: dict) -> Event | None:
    try:
        return from_record(record)
    except ValueError as exc:
        _skipped(path, None, exc)
        return None


def _skipped(path: Path, offset: int | None, reason: Exception) -> None:
    where = f"{path}" + ("" if offset is None else f" at byte {offset}")
    warnings.warn(f"{where}: a line that is not an event ({reason}) is skipped", RuntimeWarning, stacklevel=3)
