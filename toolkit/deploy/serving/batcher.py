"""Continuous batching: every forward pass serves every request in flight.

One scheduler thread owns the model. Requests wait in a queue; when the model is idle the first request
waits up to ``max_wait_ms`` for company (up to ``max_batch`` requests), then each step runs one forward over
all active requests and gives each generating request its next token. A request that finishes leaves the
batch at once and a waiting one joins at the next step, so a long generation never holds short ones back.

Rows of different lengths share one forward by right-padding: with causal attention, position t sees only
positions <= t, so the logits at each row's last real position are exactly those of the row alone. A runtime
with a KV cache (a transformers causal LM on torch) generates differently: each request's prompt runs once, then
one forward over the cache gives every generating request its next token (toolkit.deploy.serving.kv_cache).
A classifier's rows are not padded (its label is read at the last position): they share forwards by length.
``max_batch=1`` turns batching off (one request at a time), the baseline the benchmark compares against.

``max_batch`` counts requests, but memory grows with rows: a 16 KB text scored in 32-byte windows is 529 rows.
No forward takes more than ``max_rows`` rows (MAX_ROWS_PER_FORWARD); a long text's windows are spread over
several steps, shared fairly with the other requests in flight. A request whose client gave up (its Future
was cancelled) or whose deadline passed leaves the batch at the next step: no work is done for nobody.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

import numpy as np

from toolkit.deploy.serving.protocol import ClassifyRequest, GenerateRequest, RequestError, ScoreRequest
from toolkit.errors import RefusedValue, not_allowed, refused

MAX_ROWS_PER_FORWARD = 64  # rows of at most block_size ids in one forward: what bounds the server's memory


class _Job:
    """A request in flight: the rows it needs this step, and what it does with their logits."""

    padded = True  # its rows may be right-padded into a forward shared with longer rows (causal models)

    def __init__(self, request, runtime, deadline: float | None):
        self.request, self.block_size, self.deadline = request, runtime.block_size, deadline
        self.tokenizer = runtime.tokenizer
        self.future: Future = Future()
        self.submitted = time.perf_counter()
        self.started: float | None = None
        self.steps = 0
        self.done = False

    def wants(self) -> int:
        """How many rows this job could use in the next forward."""
        return 1

    def finish(self, result: dict) -> None:
        now = time.perf_counter()
        result["timing_ms"] = {
            "queue": round(1000 * (self.started - self.submitted), 3),
            "compute": round(1000 * (now - self.started), 3),
            "total": round(1000 * (now - self.submitted), 3),
            "steps": self.steps,
        }
        self.settle(result)

    def settle(self, result: dict | None = None, error: BaseException | None = None) -> None:
        """Answer the Future once; a Future its client cancelled meanwhile takes no answer (not an error)."""
        self.done = True
        try:
            self.future.set_exception(error) if error is not None else self.future.set_result(result)
        except InvalidStateError:
            pass

    def abandoned(self, now: float) -> bool:
        """Nobody waits for this answer any more: the client cancelled, or the deadline passed."""
        if self.future.cancelled():
            return True
        if self.deadline is not None and now > self.deadline:
            self.settle(error=TimeoutError(f"no answer within the request deadline ({self.steps} steps done)"))
            return True
        return False


class _Generate(_Job):
    """Generation that runs the model over the context window (the newest block_size tokens) for every new token:
    how ONNX Runtime and the built-in GPT generate."""

    listener: Callable[[str], None] | None = None  # streaming: called with each new piece of text

    def __init__(self, request: GenerateRequest, runtime, deadline: float | None):
        super().__init__(request, runtime, deadline)
        given = request.prompt_ids
        self.ids = list(given) if given is not None else self.tokenizer.encode(request.prompt)
        if not self.ids:
            raise RequestError(refused("prompt", "encodes to no tokens", "text the model's tokenizer encodes"))
        self.prompt_tokens = len(self.ids)
        self.new: list[int] = []
        self.sent = 0  # characters of the text already given to the listener
        self.rng = np.random.default_rng(request.seed)

    def rows(self, count: int) -> list[list[int]]:
        return [self.ids[-self.block_size :]]

    def consume(self, logits: list[np.ndarray]) -> None:
        (row,) = logits
        self.add(row[-1])

    def add(self, logits: np.ndarray) -> None:
        """The next token from its logits; the answer once max_new_tokens are out, an end-of-sequence id came or
        the text reached a stop string (finish_reason 'length' or 'stop')."""
        self.new.append(_sample(logits, self.request, self.rng))
        self.ids.append(self.new[-1])
        last = self.new[-1]
        reason = "stop" if last in self.tokenizer.eos_ids or last in self.request.stop_ids else None
        text = None
        if self.request.stop or self.listener:
            text = self.tokenizer.decode(self.new)
            cut = min((i for stop in self.request.stop if (i := text.find(stop)) >= 0), default=-1)
            if cut >= 0:
                text, reason = text[:cut], "stop"
        if reason is None and len(self.new) == self.request.max_new_tokens:
            reason = "length"
        if self.listener:
            self._stream(text, final=reason is not None)
        if reason:
            self.finish(
                {
                    "task": "generate",
                    "text": self.tokenizer.decode(self.new) if text is None else text,
                    "prompt_bytes": len(self.request.prompt),
                    "prompt_tokens": self.prompt_tokens,
                    "new_tokens": len(self.new),
                    "finish_reason": reason,
                }
            )

    def _stream(self, text: str, final: bool) -> None:
        """Give the listener the text not given yet, holding back (until the end) what may still become a stop
        string or is half a character (a multi-byte character decodes to U+FFFD until its last byte)."""
        safe = len(text)
        if not final:
            safe -= len(text) - len(text.rstrip("\ufffd"))
            held = max(
                (k for stop in self.request.stop for k in range(1, len(stop)) if text[:safe].endswith(stop[:k])),
                default=0,
            )
            safe -= held
        if safe > self.sent:
            self.listener(text[self.sent : safe])
            self.sent = safe


class _CachedGenerate(_Generate):
    """Generation over the batcher's KV cache (toolkit.deploy.serving.kv_cache): the prompt once, then one position
    per new token. Prompt and generation must fit the model's context: a cache does not slide."""

    joined = False  # has a row in the cache

    def __init__(self, request: GenerateRequest, runtime, deadline: float | None):
        super().__init__(request, runtime, deadline)
        context = self.block_size
        if self.prompt_tokens >= context:
            raise RequestError(
                refused(
                    "prompt",
                    f"{self.prompt_tokens:,} tokens is over the model's context",
                    f"up to {context - 1:,} tokens",
                )
            )
        if self.prompt_tokens + request.max_new_tokens > context:
            raise RequestError(
                not_allowed(
                    "max_new_tokens",
                    request.max_new_tokens,
                    f"up to {context - self.prompt_tokens:,}",
                    problem=f"does not fit the model's context of {context:,} tokens after a prompt of "
                    f"{self.prompt_tokens:,}",
                )
            )


class _Score(_Job):
    """Log-likelihood of a text: each token predicted from the ones before it, in windows of the context size
    (a window starts afresh, so a token past the first window sees less than block_size tokens of history)."""

    def __init__(self, request: ScoreRequest, runtime, deadline: float | None):
        super().__init__(request, runtime, deadline)
        ids = self.tokenizer.encode(request.text)
        block_size = self.block_size
        # windows overlap by one token, so every token after the first is predicted exactly once
        self.windows = [ids[i : i + block_size] for i in range(0, max(len(ids) - 1, 1), block_size - 1)]
        # what the first token spells is given, not predicted (nothing, for a tokenizer that starts with a BOS)
        self.predicted_bytes = len(request.text) - len(self.tokenizer.decode(ids[:1]).encode("utf-8"))
        self.next = 0  # windows before this one are scored
        self.total, self.count = 0.0, 0

    def wants(self) -> int:
        return len(self.windows) - self.next

    def rows(self, count: int) -> list[list[int]]:
        return self.windows[self.next : self.next + count]

    def consume(self, logits: list[np.ndarray]) -> None:
        for row, window in zip(logits, self.windows[self.next : self.next + len(logits)]):
            log_probs = log_softmax(row[: len(window) - 1])
            targets = np.asarray(window[1:])
            self.total += float(log_probs[np.arange(len(targets)), targets].sum())
            self.count += len(targets)
        self.next += len(logits)
        if self.next == len(self.windows):
            predicted = self.predicted_bytes if self.count else 0
            self.finish(
                {
                    "task": "score",
                    "log_likelihood": self.total,
                    "predicted_tokens": self.count,
                    "predicted_bytes": predicted,
                    "bits_per_byte": -self.total / np.log(2) / predicted if predicted else None,
                }
            )


class _Classify(_Job):
    """A sequence classifier's label and class probabilities for a text. Its row is never padded: a decoder-only
    classifier reads the label off the last position, so rows share a forward only with rows of their length."""

    padded = False

    def __init__(self, request: ClassifyRequest, runtime, deadline: float | None):
        super().__init__(request, runtime, deadline)
        self.ids = self.tokenizer.encode(request.text)
        if not self.ids or len(self.ids) > self.block_size:
            raise RequestError(
                refused(
                    "text",
                    f"{len(self.ids):,} tokens is not allowed",
                    f"1 to {self.block_size:,} tokens (the model's context)",
                )
            )
        self.labels = runtime.labels

    def rows(self, count: int) -> list[list[int]]:
        return [self.ids]

    def consume(self, logits: list[np.ndarray]) -> None:
        (row,) = logits
        probabilities = np.exp(log_softmax(row.astype(np.float64)))
        best = int(np.argmax(probabilities))
        self.finish(
            {
                "task": "classify",
                "label": self.labels[best],
                "label_id": best,
                "probabilities": {label: float(p) for label, p in zip(self.labels, probabilities)},
            }
        )


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities over the last axis, shifted by the maximum so that no exp overflows (also
    toolkit.report.token_bits's)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _sample(logits: np.ndarray, request: GenerateRequest, rng: np.random.Generator) -> int:
    if request.temperature == 0.0:
        return int(np.argmax(logits))
    logits = logits.astype(np.float64) / request.temperature
    if request.top_k:
        cutoff = np.partition(logits, -request.top_k)[-request.top_k]
        logits = np.where(logits < cutoff, -np.inf, logits)
    if request.top_p < 1.0:  # the most probable tokens whose probabilities add up to top_p, the first that reaches it
        order = np.argsort(-logits)
        probs = np.exp(logits[order] - logits[order[0]])
        kept = order[: int(np.searchsorted(np.cumsum(probs) / probs.sum(), request.top_p)) + 1]
        nucleus = np.full_like(logits, -np.inf)
        nucleus[kept] = logits[kept]
        logits = nucleus
    cdf = np.cumsum(np.exp(logits - logits.max()))
    # inverse-CDF sampling: what rng.choice(p=...) does, without its per-call validation (10x slower here)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))


JOBS = {GenerateRequest: _Generate, ScoreRequest: _Score, ClassifyRequest: _Classify}


def share_rows(wants: list[int], budget: int, first: int = 0) -> list[int]:
    """Rows each job gets in one forward: at most what it wants, at most ``budget`` in all, shared evenly
    (water-filling: what a small job leaves goes to the bigger ones). When there are more jobs than rows,
    jobs from index ``first`` on are served first; the caller moves ``first`` each step, so none starves."""
    given = [0] * len(wants)
    order = [(first + k) % len(wants) for k in range(len(wants))] if wants else []
    while budget > 0:
        hungry = [i for i in order if given[i] < wants[i]]
        if not hungry:
            break
        share = max(1, budget // len(hungry))
        for i in hungry:
            take = min(share, wants[i] - given[i], budget)
            given[i] += take
            budget -= take
            if not budget:
                break
    return given


class Batcher:
    """Owns the runtime; :meth:`submit` returns a Future with the response dict. A runtime that offers a KV cache
    (``decoder()``) generates with it unless ``kv_cache`` is False (the benchmark's baseline)."""

    def __init__(
        self,
        runtime,
        max_batch: int = 16,
        max_wait_ms: float = 5.0,
        max_rows: int = MAX_ROWS_PER_FORWARD,
        kv_cache: bool = True,
    ):
        # max_batch and max_wait_ms come checked (toolkit.deploy.serving.options owns their bounds)
        if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
            raise RefusedValue(not_allowed("max_rows", max_rows, "an integer from 1"))
        self.runtime, self.max_batch, self.max_wait_s = runtime, max_batch, max_wait_ms / 1000
        self.max_rows = max_rows
        # the rows generating with the KV cache; only the scheduler thread touches it
        self.decoder = runtime.decoder() if kv_cache and hasattr(runtime, "decoder") else None
        self.queue: queue.Queue[_Job] = queue.Queue()
        # answered + dropped counts every request that has left the batcher
        self.stats = {"forwards": 0, "rows": 0, "largest_forward_rows": 0, "answered": 0, "dropped": 0}
        self._turn = 0  # who is served first when rows are short (see share_rows)
        self._thread = threading.Thread(target=self._loop, name="trainbook-batcher", daemon=True)
        self._thread.start()

    def submit(self, request, deadline: float | None = None, listener: Callable[[str], None] | None = None) -> Future:
        """Queue ``request``; the Future gets its answer. ``deadline`` (a time.perf_counter() value): past it the
        work is dropped and the Future fails with TimeoutError. Cancelling the Future drops the work too. A request
        the model cannot take (a prompt beyond its context) is refused here, in the caller's thread: RequestError.
        ``listener`` (generation only): called in the batcher's thread with each new piece of text, for streaming."""
        kind = JOBS[type(request)]
        if kind is _Generate and self.decoder is not None:
            kind = _CachedGenerate
        job = kind(request, self.runtime, deadline)  # tokenizes: in the request's thread, not the model's
        if listener is not None:
            job.listener = listener
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
            kept = [job for job in active if not job.abandoned(now)]
            self.stats["dropped"] += len(active) - len(kept)
            active = kept
            if not active:
                continue
            for job in active:
                job.started = job.started or now
            try:
                self._step(active)
            except Exception as exc:  # a failing forward fails its requests, never the scheduler
                for job in active:
                    job.settle(error=exc)
            self.stats["answered"] += sum(job.done for job in active)
            active = [job for job in active if not job.done]
            if self.decoder is not None:  # finished, failed and abandoned rows leave the cache now
                self.decoder.retain([job for job in self.decoder.members if job in active])

    def _count(self, rows: int) -> None:
        self.stats["forwards"] += 1
        self.stats["rows"] += rows
        self.stats["largest_forward_rows"] = max(self.stats["largest_forward_rows"], rows)

    def _step(self, active: list[_Job]) -> None:
        cached = [job for job in active if isinstance(job, _CachedGenerate)]
        if cached:
            self._decode(cached)
        rowed = [job for job in active if not isinstance(job, _CachedGenerate)]
        if rowed:
            self._forward_rows(rowed)

    def _decode(self, jobs: list[_CachedGenerate]) -> None:
        """One token for every job: from one forward over the cache for those in it, from its prompt's forward
        (its prefill) for a job that joins. At most max_rows rows are in the cache; later jobs wait their turn."""
        stepping = list(self.decoder.members)  # the cache holds only live jobs (_loop retains them each step)
        if stepping:
            logits = self.decoder.step([job.new[-1] for job in stepping]).float().cpu().numpy()
            self._count(len(stepping))
            for job, row in zip(stepping, logits):
                job.steps += 1
                job.add(row)
        for job in jobs:  # after the step: a row that joins has its first token from its prefill already
            if not job.joined and len(self.decoder) < self.max_rows:
                logits = self.decoder.join(job, job.ids)
                job.joined = True
                self._count(1)
                job.steps += 1
                job.add(logits.float().cpu().numpy())

    def _forward_rows(self, active: list[_Job]) -> None:
        counts = share_rows([job.wants() for job in active], self.max_rows, self._turn % len(active))
        self._turn += 1
        plan = [(job, job.rows(count)) for job, count in zip(active, counts) if count]
        # rows that may be right-padded share one forward; the others one forward per length
        groups: dict[int | None, list] = {}
        for job, job_rows in plan:
            groups.setdefault(None if job.padded else len(job_rows[0]), []).append((job, job_rows))
        for group in groups.values():
            self._forward(group)

    def _forward(self, plan: list[tuple[_Job, list[list[int]]]]) -> None:
        rows = [row for _, job_rows in plan for row in job_rows]
        width = max(len(row) for row in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)  # right padding: never seen by real positions
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
        logits = self.runtime.forward(ids)
        self._count(len(rows))
        first = 0
        for job, job_rows in plan:
            job.steps += 1
            # a padded row's logits stop at its own length; an unpadded row's are whole (a classifier's: per label)
            job.consume(
                [logits[first + i, : len(row)] if job.padded else logits[first + i] for i, row in enumerate(job_rows)]
            )
            first += len(job_rows)
