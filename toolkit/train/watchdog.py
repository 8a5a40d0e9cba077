"""The training watchdog: a run never diverges or hangs silently.

    guard = NonFiniteGuard(cfg.watchdog)        what a step whose update the engine skipped means: skip it, or stop
    watchdog = HangWatchdog(cfg, run, rank, ...)
    watchdog.start(step)                        a thread per rank, from the first step on
    watchdog.step_done(step)                    after every step (a clock read and an append)
    with watchdog.phase("evaluation"): ...      work the recent steps' time does not predict
    watchdog.close()

Non-finite steps (watchdog.nonfinite). The engine checks the step's gradients before the optimizer step
(:func:`gradients_finite`) and leaves out an update that is not finite (``engine.update_skipped``). The gradients, not
the loss, decide, because they are the same on every rank after the all-reduce: a NaN loss on one rank makes its
gradients NaN, the all-reduce carries them to every rank, and all ranks skip (or stop at) the same step; a loss is one
rank's own and would make the ranks diverge. The check costs one host sync per step, after the backward: on a GPU the
CPU waits for the backward before it queues the optimizer step, the sync GradScaler makes in fp16. The norm read is the
one gradient clipping computes anyway (optim.grad_clip > 0, the default); without clipping it is one pass over the
gradients. DeepSpeed's ZeRO and bf16 optimizers make that check and sync themselves, so there the watchdog adds none.

Hangs (watchdog.hang). A thread per rank wakes when the rank is overdue (:class:`HangClock`: no step completed within
hang_factor x the median of the recent steps, at least hang_min_seconds; hang_allowance_seconds for the first steps and
for the first evaluation or checkpoint), dumps every thread's Python stack with faulthandler into
RUN_DIR/hangs/attempt_<a>/rank_<r>.txt, says so on stderr (the job log), rank 0 records a HangEvent and the failure in
status.json, and, once every rank's dump is there (a rank stuck in a collective makes the others wait in theirs, so
every rank's watchdog fires), rank 0 ends the training processes, the other ranks after it: the supervisor restarts
them from the last checkpoint. Off under debug.enabled, where a breakpoint is a wanted hang. The thread needs the GIL:
collectives and waits release it, but a rank stuck in C code that holds it would not be seen.
"""

from __future__ import annotations

import contextlib
import faulthandler
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path

import torch

from toolkit import status as run_status
from toolkit.events import HangEvent, NonFiniteEvent

WINDOW = 20  # the recent steps whose median is "the step time"
WARMUP_STEPS = 5  # the first steps of a start (compilation, allocator warm-up) get hang_allowance_seconds
HANGS_DIR = "hangs"  # in the run directory: attempt_<a>/rank_<r>.txt
PEER_POLL_S = 0.1  # how often a rank that has dumped looks for the other ranks' dumps


class NonFiniteLossError(RuntimeError):
    """The run stopped at a step whose loss or gradients were not finite; the message names the step and the loss."""


# --- non-finite steps -------------------------------------------------------------------------------------------------


def gradients_finite(parameters, norm: torch.Tensor | None = None) -> bool:
    """Whether a step's gradients are all finite, from their global norm: ``norm`` if clipping computed it, else
    computed here (one pass over the gradients). Call it on the all-reduced gradients, which every rank holds alike."""
    if norm is None:
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return True
        norm = torch.nn.utils.get_total_norm(grads)
    if hasattr(norm, "full_tensor"):  # a DTensor (sharded gradients, FSDP): the norm over every rank's shards
        norm = norm.full_tensor()
    return bool(torch.isfinite(norm))  # the step's one host sync


class NonFiniteGuard:
    """What a step whose update the engine left out means for the run (watchdog.nonfinite): skipped and counted, or
    the end of the run. ``skipped``: the count so far (a resumed run continues it from its checkpoint)."""

    def __init__(self, cfg, skipped: int = 0):
        self.cfg = cfg
        self.skipped = skipped
        self.in_a_row = 0

    def judge(self, update_skipped: bool) -> str | None:
        """None when the update was applied; otherwise 'skipped' or 'stopped', what the run does about it."""
        if not update_skipped:
            self.in_a_row = 0
            return None
        self.in_a_row += 1
        if self.cfg.nonfinite == "skip" and self.in_a_row < self.cfg.max_consecutive_skips:
            self.skipped += 1
            return "skipped"
        return "stopped"

    def train_fields(self) -> dict:
        """The count a train event carries (nonfinite=skip only: the other modes never skip one and train on)."""
        return {"nonfinite_skipped": self.skipped} if self.cfg.nonfinite == "skip" else {}

    def event(self, step: int, losses: list[float], action: str, checkpoint: str | None = None) -> NonFiniteEvent:
        """The event of step ``step`` whose ranks had ``losses`` (in rank order)."""
        return NonFiniteEvent(
            step=step,
            loss=f"{sum(losses) / len(losses):.6g}",
            ranks=[rank for rank, loss in enumerate(losses) if not math.isfinite(loss)],
            action=action,
            skipped=self.skipped,
            in_a_row=self.in_a_row,
            checkpoint=checkpoint,
        )


# --- hangs ------------------------------------------------------------------------------------------------------------


class HangClock:
    """When a rank is overdue. Pure bookkeeping, the time passed in (monotonic seconds); the loop's thread writes it,
    the watchdog's thread reads it (each write replaces one attribute, so a reader never sees half an update).

    The time of a step is the time between two completed steps, evaluation and checkpoints left out (each is a
    phase, with a limit from its own history), so that it is what the limit is compared with."""

    def __init__(self, cfg):
        self.factor, self.floor = cfg.hang_factor, cfg.hang_min_seconds
        self.allowance = max(cfg.hang_allowance_seconds, cfg.hang_min_seconds)
        self.recent: deque[float] = deque(maxlen=WINDOW)
        self.longest: dict[str, float] = {}  # phase -> its longest duration so far
        self.step = 0  # the last step completed
        self.mark = (0.0, "start")  # (when, what): the last progress, and what has been under way since

    def start(self, now: float, step: int) -> None:
        self.step, self.mark = step, (now, "start")

    def step_done(self, now: float, step: int) -> None:
        self.recent.append(now - self.mark[0])
        self.step, self.mark = step, (now, "step")

    def enter(self, now: float, phase: str) -> None:
        self.mark = (now, phase)

    def leave(self, now: float) -> None:
        since, phase = self.mark
        self.longest[phase] = max(self.longest.get(phase, 0.0), now - since)
        self.mark = (now, "step")

    def limit(self, phase: str) -> float:
        """How long ``phase`` may take: hang_factor x its usual time (the median recent step; a phase's longest so
        far), at least hang_min_seconds; hang_allowance_seconds while there is no usual time yet."""
        if phase in ("start", "step"):
            usual = statistics.median(self.recent) if len(self.recent) >= WARMUP_STEPS else None
        else:
            usual = self.longest.get(phase)
        return self.allowance if usual is None else max(self.floor, self.factor * usual)

    def deadline(self) -> float:
        since, phase = self.mark
        return since + self.limit(phase)


def dump_stacks(path: Path, header: str) -> None:
    """Every thread's Python stack in this process into ``path``, after ``header`` and the threads' names.
    faulthandler reads the frames without running Python code in the stuck threads. Written under a temporary name
    and renamed: a rank waiting for its peers' dumps sees each one whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    names = ", ".join(f"0x{t.ident:016x} {t.name}" for t in threading.enumerate() if t.ident is not None)
    with open(tmp, "w") as f:
        f.write(f"{header}\nthreads: {names}\n\n")
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        os.fsync(f.fileno())
    os.replace(tmp, path)


def end_training_processes() -> None:
    """SIGKILL this process's group: every rank of this node and their launcher (as fault.kill_at_step does). A stuck
    rank cannot be asked to leave, its main thread never returns to Python; the supervisor, in a group of its own,
    sees the launcher die and restarts the run from its last checkpoint."""
    os.killpg(os.getpgrp(), signal.SIGKILL)


class HangWatchdog:
    """The hang watch of one rank (watchdog.hang; off under debug.enabled, where a breakpoint is a wanted hang).
    ``events``: rank 0's event log, where the hang is recorded (None on the other ranks). ``end``: what ends the
    training once the stacks are dumped."""

    def __init__(self, cfg, run, rank: int, world_size: int, attempt: int, events=None, end=end_training_processes):
        self.enabled = cfg.watchdog.hang and not cfg.debug.enabled
        self.clock = HangClock(cfg.watchdog)
        self.run, self.rank, self.world_size, self.attempt = run, rank, world_size, attempt
        self.folder = Path(run.path) / HANGS_DIR / f"attempt_{attempt}"
        self.events, self.end = events, end
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, step: int) -> None:
        self.clock.start(time.monotonic(), step)
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="trainbook-watchdog", daemon=True)
            self._thread.start()

    def step_done(self, step: int) -> None:
        self.clock.step_done(time.monotonic(), step)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Evaluation, a checkpoint: judged against its own earlier durations, not the step time."""
        self.clock.enter(time.monotonic(), name)
        try:
            yield
        finally:
            self.clock.leave(time.monotonic())

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _watch(self) -> None:
        # Sleeps until the deadline, or half the shortest limit if that is sooner: progress can bring the deadline
        # nearer (the end of the warm-up steps or of a phase), but never nearer than hang_min_seconds after it, so
        # every new deadline is seen before it passes. Between steps, nothing runs here.
        while not self._closed.wait(min(max(0.0, self.clock.deadline() - time.monotonic()), self.clock.floor / 2)):
            now = time.monotonic()
            if now >= self.clock.deadline():
                self._fire(now)
                return

    def _fire(self, now: float) -> None:
        since, phase = self.clock.mark
        limit = self.clock.limit(phase)
        event = HangEvent(
            step=self.clock.step,
            phase=phase,
            waited_s=round(now - since, 3),
            limit_s=round(limit, 3),
            stacks=str(self.folder),
            attempt=self.attempt,
        )
        notice = f"[watchdog rank {self.rank}] {event.summary}"
        try:
            dump_stacks(
                self.folder / f"rank_{self.rank}.txt", f"rank {self.rank} of {self.world_size}: {event.summary}"
            )
        except OSError as exc:  # the run directory is unwritable: the job log gets the stacks instead
            notice += f" (cannot write {self.folder}: {exc}; stacks follow)"
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        print(
            f"{notice}; ending the training processes for the supervisor to restart them from the last checkpoint",
            file=sys.stderr,
            flush=True,
        )
        if self.events is not None:
            try:
                self.events.write(event)
                run_status.transition(self.run, "fail", error=f"hang: {event.summary}")
            except Exception as exc:  # a record that cannot be written must not keep the rank alive
                print(f"[watchdog rank {self.rank}] could not record the hang: {exc}", file=sys.stderr, flush=True)
        self._await_peer_dumps(time.monotonic() + limit)
        if self.rank != 0:
            # Rank 0 ends first: were a peer gone before it, its loop would record the lost connection as the run's
            # error, over the hang. Its end reaches this rank through the launcher, or else this rank ends itself.
            self._closed.wait(limit)
        self.end()

    def _await_peer_dumps(self, deadline: float) -> None:
        """Until every rank's dump is there (ending the processes now would cut a peer's short) or ``deadline``:
        the peers' watchdogs fire within about a step of this one, their last steps having ended together."""
        expected = [self.folder / f"rank_{r}.txt" for r in range(self.world_size)]
        while not all(p.exists() for p in expected) and time.monotonic() < deadline:
            if self._closed.wait(PEER_POLL_S):
                return
