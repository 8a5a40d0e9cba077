"""The endpoint's behaviour, independent of any HTTP server: authenticate, read, validate, batch, answer.

``score.py`` adapts Azure ML's inference server to this; the benchmark calls it in-process to measure what
the HTTP layer adds. Every outcome is (HTTP status, JSON-ready dict): no exception escapes to the server,
so a bad request can never take it down or leak a stack trace.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable

from toolkit.deploy.serving.batcher import Batcher
from toolkit.deploy.serving.options import ServingOptions
from toolkit.deploy.serving.protocol import MAX_BODY_BYTES, RequestError, body_too_large, parse
from toolkit.deploy.serving.runtimes import describe, load_runtime
from toolkit.errors import refused

CLIENT_CHECK_S = 0.25  # how often a waiting request looks whether its client is still connected
log = logging.getLogger("trainbook.serving")


def authorised(key: str | None, authorization: str | None) -> bool:
    """``Authorization: Bearer <key>``. The scheme name is case-insensitive (RFC 7235 section 2.1); the key is
    compared in constant time. ``key`` None: no check (Azure ML checks keys before requests reach us)."""
    if key is None:
        return True
    if not key:  # never a check that an empty token passes (key_files refuses an empty key before it gets here)
        return False
    scheme, _, token = (authorization or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())


class ScoringService:
    def __init__(self, model_dir, options: ServingOptions = ServingOptions(), key: str | None = None):
        self.runtime = load_runtime(model_dir, options.runtime)
        self.batcher = Batcher(self.runtime, max_batch=options.max_batch, max_wait_ms=options.max_wait_ms)
        self.key = key
        self.request_timeout = options.request_timeout
        self.info = {
            **describe(self.runtime),
            "max_batch": options.max_batch,
            "max_wait_ms": options.max_wait_ms,
            "max_rows_per_forward": self.batcher.max_rows,
        }

    def handle(
        self,
        method: str,
        authorization: str | None,
        content_length: int | None,
        read_body: Callable[[int], bytes],
        client_gone: Callable[[], bool] | None = None,
    ) -> tuple[int, dict]:
        """One request. ``read_body(n)`` reads at most n bytes, so an oversized body is never held in memory;
        ``client_gone()`` says whether the client has hung up (its work is then dropped)."""
        started = time.perf_counter()
        key_ok = authorised(self.key, authorization)
        if method == "GET":  # readiness; the details (run, data asset, step, load) only for the key's holder
            return 200, {"ready": True, **self.info, **self.batcher.stats} if key_ok else {"ready": True}
        if method != "POST":
            return 405, {"error": refused("method", f"{method} is not allowed", "GET (readiness), POST (score)")}
        if not key_ok:
            reason = "missing" if not authorization else "not valid"
            return 401, {"error": refused("Authorization", f"key {reason}", "'Authorization: Bearer <endpoint key>'")}
        try:
            if content_length is not None and content_length > MAX_BODY_BYTES:
                raise body_too_large(content_length)
            request = parse(read_body(MAX_BODY_BYTES + 1), self.runtime.tasks)
            deadline = started + self.request_timeout
            future = self.batcher.submit(request, deadline=deadline)  # refuses what does not fit the model
        except RequestError as exc:
            return exc.status, {"error": str(exc)}
        try:
            result = self.await_answer(future, deadline, client_gone)
        except TimeoutError:
            return 503, {
                "error": f"no answer within {self.request_timeout:g} s: the endpoint is overloaded; try again later"
            }
        except Exception:  # the model failed: logged with its traceback here, a plain message to the client
            log.exception("scoring failed")
            return 500, {"error": "the model failed on this request; see the endpoint log"}
        if result is None:
            return 499, {"error": "the client closed the connection before the answer"}  # nobody reads this
        result["timing_ms"]["server"] = round(1000 * (time.perf_counter() - started), 3)
        return 200, result

    @staticmethod
    def await_answer(future, deadline: float, client_gone: Callable[[], bool] | None) -> dict | None:
        """The answer; None if the client hung up first; TimeoutError once ``deadline`` (a time.perf_counter()
        value) has passed. The wait keeps the deadline itself: the batcher checks it only for work in the batch,
        and what is ahead in the queue may have none. Work nobody waits for is cancelled: the batcher drops it."""
        while True:
            left = deadline - time.perf_counter()
            try:
                return future.result(timeout=max(0.0, min(left, CLIENT_CHECK_S) if client_gone else left))
            except TimeoutError:
                if future.done():  # answered just now, or the batcher's deadline passed (its TimeoutError)
                    return future.result()
            timed_out = time.perf_counter() >= deadline
            if timed_out or client_gone is not None and client_gone():
                if not future.cancel():  # answered in the meantime
                    return future.result()
                if timed_out:
                    raise TimeoutError("no answer within the request deadline")
                return None
