"""Continuous batching: every forward pass serves every request in flight.

One scheduler thread owns the model. Requests wait in a queue; when the model is idle the first request
waits up to ``max_wait_ms`` for company (up to ``max_batch`` requests), then each step runs one forward over
all active requests and gives each generating request its next token. A request that finishes leaves the
batch at once and a waiting one joins at the next step, so a long generation never holds short ones back.

Rows of different lengths share one forward by right-padding: with causal attention, position t sees only
positions <= t, so the logits at each row's last real position are exactly those of the row alone.
``max_batch=1`` turns batching off (one request at a time), the baseline the benchmark compares against.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future

import numpy as np

from toolkit.serving.protocol import GenerateRequest, ScoreRequest


class _Job:
    """A request in flight: the rows it needs this step, and what it does with their logits."""

    def __init__(self, request, block_size: int):
        self.request, self.block_size = request, block_size
        self.future: Future = Future()
        self.submitted = time.perf_counter()
        self.started: float | None = None
        self.steps = 0
        self.done = False

    def finish(self, result: dict) -> None:
        now = time.perf_counter()
        result["timing_ms"] = {"queue": round(1000 * (self.started - self.submitted), 3),
                               "compute": round(1000 * (now - self.started), 3),
                               "total": round(1000 * (now - self.submitted), 3), "steps": self.steps}
        self.done = True
        self.future.set_result(result)


class _Generate(_Job):
    def __init__(self, request: GenerateRequest, block_size: int):
        super().__init__(request, block_size)
        self.ids = list(request.prompt)
        self.new: list[int] = []
        self.rng = np.random.default_rng(request.seed)

    def rows(self) -> list[list[int]]:
        return [self.ids[-self.block_size:]]  # the model sees its context window, the newest bytes

    def consume(self, logits: list[np.ndarray]) -> None:
        (row,) = logits
        self.new.append(_sample(row[-1], self.request, self.rng))
        self.ids.append(self.new[-1])
        if len(self.new) == self.request.max_new_tokens:
            self.finish({"task": "generate", "text": bytes(self.new).decode("utf-8", errors="replace"),
                         "prompt_bytes": len(self.request.prompt), "new_tokens": len(self.new)})


class _Score(_Job):
    """Log-likelihood of a text: each byte predicted from the ones before it, in windows of the context size
    (a window starts afresh, so a byte past the first window sees less than block_size bytes of history)."""

    def __init__(self, request: ScoreRequest, block_size: int):
        super().__init__(request, block_size)
        ids = list(request.text)
        # windows overlap by one byte, so every byte after the first is predicted exactly once
        self.windows = [ids[i:i + block_size] for i in range(0, max(len(ids) - 1, 1), block_size - 1)]

    def rows(self) -> list[list[int]]:
        return self.windows

    def consume(self, logits: list[np.ndarray]) -> None:
        total, count = 0.0, 0
        for row, window in zip(logits, self.windows):
            log_probs = _log_softmax(row[: len(window) - 1])
            targets = np.asarray(window[1:])
            total += float(log_probs[np.arange(len(targets)), targets].sum())
            count += len(targets)
        self.finish({"task": "score", "log_likelihood": total, "predicted_bytes": count,
                     "bits_per_byte": -total / np.log(2) / count if count else None})


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _sample(logits: np.ndarray, request: GenerateRequest, rng: np.random.Generator) -> int:
    if request.temperature == 0.0:
        return int(np.argmax(logits))
    logits = logits.astype(np.float64) / request.temperature
    if request.top_k:
        cutoff = np.partition(logits, -request.top_k)[-request.top_k]
        logits = np.where(logits < cutoff, -np.inf, logits)
    cdf = np.cumsum(np.exp(logits - logits.max()))
    # inverse-CDF sampling: what rng.choice(p=...) does, without its per-call validation (10x slower here)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))


JOBS = {GenerateRequest: _Generate, ScoreRequest: _Score}


class Batcher:
    """Owns the runtime; :meth:`submit` returns a Future with the response dict."""

    def __init__(self, runtime, max_batch: int = 16, max_wait_ms: float = 5.0):
        if not 1 <= max_batch <= 256:
            raise ValueError(f"max_batch: {max_batch} is not allowed; allowed: 1 to 256")
        if not 0 <= max_wait_ms <= 1000:
            raise ValueError(f"max_wait_ms: {max_wait_ms} is not allowed; allowed: 0 to 1000")
        self.runtime, self.max_batch, self.max_wait_s = runtime, max_batch, max_wait_ms / 1000
        self.queue: queue.Queue[_Job] = queue.Queue()
        self.stats = {"forwards": 0, "rows": 0}
        self._thread = threading.Thread(target=self._loop, name="trainbook-batcher", daemon=True)
        self._thread.start()

    def submit(self, request) -> Future:
        job = JOBS[type(request)](request, self.runtime.block_size)
        self.queue.put(job)
        return job.future

    def _gather(self, active: list[_Job]) -> None:
        """Top the batch up from the queue; when idle, wait for the first request, then briefly for company."""
        if not active:
            active.append(self.queue.get())
            deadline = time.perf_counter() + self.max_wait_s
            while len(active) < self.max_batch:
                try:
                    active.append(self.queue.get(timeout=max(deadline - time.perf_counter(), 0)))
                except queue.Empty:
                    break
        while len(active) < self.max_batch:
            try:
                active.append(self.queue.get_nowait())
            except queue.Empty:
                break

    def _loop(self) -> None:
        active: list[_Job] = []
        while True:
            self._gather(active)
            now = time.perf_counter()
            for job in active:
                job.started = job.started or now
            try:
                self._step(active)
            except Exception as exc:  # a failing forward fails its requests, never the scheduler
                for job in active:
                    job.done = True
                    job.future.set_exception(exc)
            active = [job for job in active if not job.done]

    def _step(self, active: list[_Job]) -> None:
        rows = [(job, row) for job in active for row in job.rows()]
        width = max(len(row) for _, row in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)  # right padding: never seen by real positions
        for i, (_, row) in enumerate(rows):
            ids[i, : len(row)] = row
        logits = self.runtime.forward(ids)
        self.stats["forwards"] += 1
        self.stats["rows"] += len(rows)
        per_job: dict[int, list[np.ndarray]] = {}
        for i, (job, row) in enumerate(rows):
            per_job.setdefault(id(job), []).append(logits[i, : len(row)])
        for job in active:
            job.steps += 1
            job.consume(per_job[id(job)])
