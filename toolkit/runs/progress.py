"""What a run has reported so far (folded from its events.jsonl), and the terminal progress bar built on it.

The notebook card (widgets/run_progress.py) folds the same events through :class:`RunProgress`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from tqdm import tqdm

from toolkit.runs import debugging
from toolkit.status import RESUMABLE_STATES
from toolkit.events import (
    CheckpointEvent,
    CompileEvent,
    DebuggerEvent,
    ErrorEvent,
    EvalEvent,
    Event,
    HangEvent,
    NonFiniteEvent,
    StatusEvent,
    TrainEvent,
)

WATCHDOG_EVENTS = (NonFiniteEvent, HangEvent)  # toolkit.train.watchdog's: shown as they come


@dataclass
class RunProgress:
    max_steps: int
    state: str = "queued"
    step: int = 0
    train: TrainEvent | None = None  # the latest train event
    val: EvalEvent | None = None  # the latest eval event
    message: str = ""  # the latest error, or where rank 0 waits for a debugger (why nothing moves)
    final: StatusEvent | None = None  # the latest status event
    watchdog: str = ""  # the latest watchdog notice: a skipped non-finite step, a hang
    checkpoint_notice: str = ""  # the first checkpoint that waited for the previous one's write (told once)
    recovered: str = ""  # how an earlier attempt ended, once a later one (a restart, a resume) runs: history
    budget_s: float = 0.0  # train.max_seconds: a time budget ends the run; max_steps is then an estimate
    estimated: bool = False  # max_steps is the time budget's estimate (TrainEvent.horizon), not the config's cap

    def apply(self, event: Event) -> None:
        if isinstance(event, StatusEvent) and event.state == "running" and self.state in RESUMABLE_STATES:
            # a new attempt: the last one's end (a kill, a failure) is history now, not the state of this one
            ended = self.final.reason if self.final is not None and self.final.reason else self.state
            self.recovered, self.message = self.message or ended, ""
        self._apply(event)

    def _apply(self, event: Event) -> None:
        if isinstance(event, TrainEvent):
            self.train, self.step, self.state = event, event.step, "running"
            if event.horizon is not None:  # a time budget moves the finish line
                self.max_steps, self.estimated = event.horizon, True
        elif isinstance(event, EvalEvent):
            self.val = event
        elif isinstance(event, StatusEvent):
            self.state, self.final = event.state, event
        elif isinstance(event, ErrorEvent):
            self.message = event.message
        elif isinstance(event, DebuggerEvent):
            self.message = "" if event.state == "attached" else debugging.notice(event)
        elif isinstance(event, WATCHDOG_EVENTS):
            self.watchdog = event.summary
        elif isinstance(event, CheckpointEvent) and not self.checkpoint_notice:
            self.checkpoint_notice = event.waited_notice or ""


def _notice(event: Event, progress: RunProgress) -> str | None:
    """The line an event (already applied to ``progress``) is shown as, above the progress, or None."""
    if isinstance(event, ErrorEvent):
        return f"error: {event.message}"
    if isinstance(event, DebuggerEvent):
        return debugging.instructions(event)
    if isinstance(event, WATCHDOG_EVENTS):
        return f"watchdog: {event.summary}"
    if isinstance(event, CompileEvent):
        return f"torch.compile: {event.summary}"
    if isinstance(event, StatusEvent) and event.state == "running" and event.dropped_examples and not event.attempt:
        return f"data: {event.dropped_examples}"
    if isinstance(event, CheckpointEvent) and event.waited_notice and event.waited_notice == progress.checkpoint_notice:
        return progress.checkpoint_notice
    return None


PLAIN_EVERY_S = 10.0  # a line this often when the output is a file or a pipe, not a terminal


def _figures(progress: RunProgress) -> dict:
    postfix = {}
    if progress.train:
        t = progress.train
        postfix.update(loss=f"{t.loss:.3f}", tok_s=f"{t.tokens_per_s:,.0f}", mfu=f"{100 * t.mfu:.0f}%")
    if progress.val:
        postfix["val"] = f"{progress.val.headline:.3f}"
    return postfix


def follow_in_terminal(
    handle, max_steps: int, file=None, progress: RunProgress | None = None, plain_every_s: float = PLAIN_EVERY_S
) -> StatusEvent | None:
    """Show step, loss, tokens/s and ETA while the run goes; return the last status event. ``progress`` (folded
    as events arrive) lets the caller see how far the run got, should the follow be interrupted. On a terminal,
    a progress bar; otherwise (a log file, CI, a pipe) a plain line every ``plain_every_s`` seconds, instead of a
    carriage-return redraw per event."""
    file = file or sys.stderr
    progress = progress or RunProgress(max_steps)
    if not (hasattr(file, "isatty") and file.isatty()):
        return _follow_plain(handle, file, progress, plain_every_s)
    with tqdm(
        total=max_steps,
        unit="step",
        file=file,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}",
    ) as bar:
        for event in handle.follow():
            progress.apply(event)
            if notice := _notice(event, progress):
                bar.write(notice)
            bar.total = progress.max_steps
            bar.update(progress.step - bar.n)
            bar.set_postfix(_figures(progress), refresh=True)
    return progress.final


def _follow_plain(handle, file, progress: RunProgress, every_s: float) -> StatusEvent | None:
    import time

    shown_at, shown_step = time.monotonic(), None

    def line() -> None:
        figures = " ".join(f"{k}={v}" for k, v in _figures(progress).items())
        print(f"step {progress.step}/{progress.max_steps} {figures}".rstrip(), file=file, flush=True)

    for batch in handle.follow_batches():
        for event in batch:
            progress.apply(event)
            if notice := _notice(event, progress):
                print(notice, file=file, flush=True)
        if progress.step != shown_step and time.monotonic() - shown_at >= every_s:
            line()
            shown_at, shown_step = time.monotonic(), progress.step
    if progress.step != shown_step:
        line()  # where it ended
    return progress.final
