"""fault.*: failures injected on purpose, so that tests prove recovery from them: a lost node (SIGKILL), a hang, a
non-finite loss, slow steps after a checkpoint (and, in toolkit.checkpoint.checkpointer, a slow disk).

Each fires on a run's first attempt only (the supervisor numbers attempts in TRAINBOOK_ATTEMPT), so a restarted run
gets past the step that broke it. The loop asks the plan at fixed points of each step; with fault.* at its defaults
every question is a comparison and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from toolkit.status import ATTEMPT_ENV


def attempt_number() -> int:
    """Which attempt of its run this process is: 0 first, +1 per restart or resume (set by the supervisor)."""
    return int(os.environ.get(ATTEMPT_ENV, "0"))


class FaultPlan:
    def __init__(self, fault, rank: int, world_size: int, attempt: int):
        self.cfg = fault
        self.first_attempt = attempt == 0
        self.is_main, self.is_last_rank = rank == 0, rank == world_size - 1
        self._slow_steps = 0  # steps left to slow down after the last checkpoint

    def before_step(self) -> None:
        """fault.slow_steps_after_checkpoint: this step sleeps fault.slow_step_ms (tests check lost_ms sees it)."""
        if self._slow_steps:
            self._slow_steps -= 1
            time.sleep(self.cfg.slow_step_ms / 1e3)

    def nan_loss(self, step: int, engine):
        """fault.nan_at_step: the coming ``step``'s loss made NaN on the last rank, so that its gradients are NaN too,
        as a real overflow's are (a NaN added to the loss would leave them finite)."""
        due = self.cfg.nan_at_step == step and self.first_attempt and self.is_last_rank
        return nan_loss(engine) if due else contextlib.nullcontext()

    def checkpoint_saved(self) -> None:
        self._slow_steps = self.cfg.slow_steps_after_checkpoint

    def after_step(self, step: int) -> None:
        """fault.kill_at_step: a lost node, every rank and the launcher killed with no goodbye; fault.hang_at_step: the
        last rank waits forever, as one stuck in a collective does (without the GIL: its watchdog thread runs)."""
        if not self.first_attempt:
            return
        if self.cfg.kill_at_step == step and self.is_main:
            os.killpg(os.getpgrp(), signal.SIGKILL)
        if self.cfg.hang_at_step == step and self.is_last_rank:
            injected_hang()


def injected_hang() -> None:
    """Wait forever on an event nobody sets (named so in the stack dumps the watchdog writes)."""
    threading.Event().wait()


@contextlib.contextmanager
def nan_loss(engine):
    """The engine's loss times NaN while the context lasts."""
    loss_fn = engine.loss_fn
    engine.loss_fn = lambda model, batch: loss_fn(model, batch) * float("nan")
    try:
        yield
    finally:
        engine.loss_fn = loss_fn
