"""The steps since the last log line, and the one collective that closes them.

Between two log lines each rank adds up its steps' losses on the device (no host sync per step), counts its steps and
its wait for data, and keeps its own clock (evaluation excluded). At the log interval every rank joins one all-reduce:
the loss, the clock (the mean: the time every rank takes its time-based decisions by, so none waits forever in a
collective another has left), whether any rank was asked to stop, and each rank's peak memory in its own slot.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from toolkit.train import distributed


@dataclass
class ClosedWindow:
    loss: float  # the mean loss of the window's steps over every rank (nan: every step's update was left out)
    seconds: float  # this rank's training time in the window
    steps: int
    data_wait_pct: float
    agreed_seconds: float  # training time so far, the mean of the ranks' clocks
    stop_votes: int  # ranks asked to stop
    peak_memory_mb: list[float]  # each rank's


class LogWindow:
    def __init__(self, device: torch.device, rank: int, world_size: int, train_seconds: float):
        self.device, self.rank, self.world_size = device, rank, world_size
        self.train_seconds = self.agreed_seconds = train_seconds  # this rank's clock; the agreed one
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.loss_steps = 0  # steps whose loss is in loss_sum: a skipped (non-finite) step's is not
        self.steps, self.data_wait, self.start = 0, 0.0, time.perf_counter()

    def step_started(self, data_wait: float) -> None:
        self.steps += 1
        self.data_wait += data_wait

    def add_loss(self, loss: torch.Tensor) -> None:
        self.loss_sum += loss.to(torch.float64)
        self.loss_steps += 1

    def exclude(self, seconds: float) -> None:
        """Time spent on something that is not training (evaluation) during the window."""
        self.start += seconds

    def close(self, stop_asked: bool, peak_memory_mb: float) -> ClosedWindow:
        elapsed = time.perf_counter() - self.start
        self.train_seconds += elapsed
        memory = [0.0] * self.world_size
        memory[self.rank] = peak_memory_mb
        total_loss, seconds_sum, stop_votes, *memory = distributed.all_reduce_sum(
            [self.loss_sum.item(), self.train_seconds, float(stop_asked), *memory], self.device
        )
        self.agreed_seconds = seconds_sum / self.world_size
        loss = total_loss / self.loss_steps / self.world_size if self.loss_steps else math.nan
        return ClosedWindow(
            loss=loss,
            seconds=elapsed,
            steps=self.steps,
            data_wait_pct=100.0 * self.data_wait / elapsed,
            agreed_seconds=self.agreed_seconds,
            stop_votes=int(stop_votes),
            peak_memory_mb=memory,
        )
