"""What a checkpoint costs: the training time it loses, not only the time it blocks.

An asynchronous checkpoint blocks the loop briefly, then copies, writes and checksums in the background on
the same cores as the training step, so the steps that overlap it run slower. The honest cost is therefore

    lost = sum over the checkpoint's steps of (step time - plain step time)

where the plain step time is the median of recent steps no checkpoint touched, and "the checkpoint's steps"
run from the step that saved it until its background work is done and the step time is back within noise of
the plain one (after-effects such as evicted caches count too, for at most ``max_tail_steps`` steps).

Example: plain steps of 0.80 s, a checkpoint whose steps take 0.81 (with 10 ms blocking), 1.9, 1.1 and
0.80 s after the write finished: lost = 0.01 + 1.1 + 0.3 + 0 = 1.41 s, although it blocked for 10 ms.

The sum is signed (a step faster than the median offsets a slower one), so noise averages out instead of
piling up; it never reports less than the blocking, which is certainly lost. One ledger per process, fed by
the training loop; it is pure bookkeeping (no clock of its own), so it can be tested with made-up durations.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

BASELINE_STEPS = 32  # plain steps the median is taken over: recent enough to follow drift, many enough to be stable
MIN_BASELINE = 3  # below this, no median is trusted: the cost falls back to the blocking time
NOISE_FRACTION = 0.10  # a step within 10% (or 3 robust deviations) of the median counts as back to normal,
MAX_NOISE_FRACTION = 0.5  # but never within more than 50%: on a noisy machine a slow step must not look settled
MAX_TAIL_STEPS = 8  # after the background work is done, after-effects are followed for at most this many steps


@dataclass
class CheckpointCost:
    """The figures of one checkpoint, once its window is closed."""

    step: int
    blocking_s: float
    lost_s: float
    steps: int  # steps in the window (the saving step included)
    baseline_step_s: float | None  # the plain step time the excess is measured against; None: too few plain steps

    @property
    def basis(self) -> str:
        return "measured" if self.baseline_step_s is not None else "blocking only"


@dataclass
class _Window:
    step: int
    baseline: float | None
    tolerance: float
    durations: list = field(default_factory=list)
    blocking_s: float = 0.0
    background_done: bool = False
    tail: int = 0  # steps seen since the background work finished


class LostTimeLedger:
    """Feed it every step's duration; it tells which checkpoints' costs are final."""

    def __init__(self, baseline_steps: int = BASELINE_STEPS, max_tail_steps: int = MAX_TAIL_STEPS):
        self.plain: deque[float] = deque(maxlen=baseline_steps)
        self.max_tail_steps = max_tail_steps
        self.open: _Window | None = None

    def baseline(self) -> tuple[float | None, float]:
        """(median plain step, tolerance) over the recent plain steps; (None, 0) with too few of them."""
        if len(self.plain) < MIN_BASELINE:
            return None, 0.0
        median = statistics.median(self.plain)
        robust_sd = 1.4826 * statistics.median(abs(d - median) for d in self.plain)
        return median, min(max(NOISE_FRACTION * median, 3 * robust_sd), MAX_NOISE_FRACTION * median)

    def checkpoint_started(self, step: int) -> CheckpointCost | None:
        """A checkpoint is being saved at the end of the current step; returns the previous window if this
        closes it (a new checkpoint ends the previous one's after-effects window)."""
        closed = self._close() if self.open else None
        baseline, tolerance = self.baseline()
        self.open = _Window(step, baseline, tolerance)
        return closed

    def add_blocking(self, seconds: float) -> None:
        """Time the loop stood still for the open checkpoint (already inside some step's duration)."""
        if self.open:
            self.open.blocking_s += seconds

    def background_done(self) -> None:
        """The open checkpoint's copy, write and checksum are finished (called from the training thread)."""
        if self.open:
            self.open.background_done = True

    def step_done(self, seconds: float) -> CheckpointCost | None:
        """One training step took ``seconds`` (evaluation excluded, checkpoint blocking included). Returns a
        checkpoint's cost when this step closes its window."""
        window = self.open
        if window is None:
            self.plain.append(seconds)
            return None
        window.durations.append(seconds)
        if not window.background_done:
            return None
        window.tail += 1
        settled = window.baseline is None or seconds <= window.baseline + window.tolerance
        if settled or window.tail >= self.max_tail_steps:
            return self._close()
        return None

    def finish(self) -> CheckpointCost | None:
        """Training is over: close the open window with the steps it has."""
        return self._close() if self.open else None

    def _close(self) -> CheckpointCost:
        window, self.open = self.open, None
        if window.baseline is None:
            lost = window.blocking_s
        else:
            lost = max(window.blocking_s, sum(d - window.baseline for d in window.durations))
        return CheckpointCost(window.step, window.blocking_s, lost, len(window.durations), window.baseline)
