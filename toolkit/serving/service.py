"""The endpoint's behaviour, independent of any HTTP server: authenticate, read, validate, batch, answer.

``score.py`` adapts Azure ML's inference server to this; the benchmark calls it in-process to measure what
the HTTP layer adds. Every outcome is (HTTP status, JSON-ready dict): no exception escapes to the server,
so a bad request can never take it down or leak a stack trace.
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Callable

from toolkit.serving.batcher import Batcher
from toolkit.serving.protocol import MAX_BODY_BYTES, RequestError, parse
from toolkit.serving.runtimes import describe, load_runtime

REQUEST_TIMEOUT_S = 120.0
log = logging.getLogger("trainbook.serving")


class ScoringService:
    def __init__(self, model_dir, runtime: str = "onnx", max_batch: int = 16, max_wait_ms: float = 5.0,
                 key: str | None = None):
        self.runtime = load_runtime(model_dir, runtime)
        self.batcher = Batcher(self.runtime, max_batch=max_batch, max_wait_ms=max_wait_ms)
        self.key = key  # None: no key check here (Azure ML's endpoint checks keys before requests reach us)
        self.info = {**describe(self.runtime), "max_batch": max_batch, "max_wait_ms": max_wait_ms}

    def _authorised(self, authorization: str | None) -> bool:
        if self.key is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        return scheme == "Bearer" and hmac.compare_digest(token.strip().encode(), self.key.encode())

    def handle(self, method: str, authorization: str | None, content_length: int | None,
               read_body: Callable[[int], bytes]) -> tuple[int, dict]:
        """One request. ``read_body(n)`` reads at most n bytes, so an oversized body is never held in memory."""
        started = time.perf_counter()
        if method == "GET":  # readiness: the model is loaded and the batcher runs (no key: probes have none)
            return 200, {"ready": True, **self.info, **self.batcher.stats}
        if method != "POST":
            return 405, {"error": f"method: {method} is not allowed; allowed: GET (readiness), POST (score)"}
        if not self._authorised(authorization):
            reason = "missing" if not authorization else "not valid"
            return 401, {"error": f"Authorization: key {reason}; allowed: 'Authorization: Bearer <endpoint key>'"}
        if content_length is not None and content_length > MAX_BODY_BYTES:
            return 413, {"error": f"body: {content_length:,} bytes is over the limit; allowed: up to "
                                  f"{MAX_BODY_BYTES:,}"}
        try:
            request = parse(read_body(MAX_BODY_BYTES + 1))
        except RequestError as exc:
            return exc.status, {"error": str(exc)}
        try:
            result = self.batcher.submit(request).result(timeout=REQUEST_TIMEOUT_S)
        except Exception:  # the model failed: logged with its traceback here, a plain message to the client
            log.exception("scoring failed")
            return 500, {"error": "the model failed on this request; see the endpoint log"}
        result["timing_ms"]["server"] = round(1000 * (time.perf_counter() - started), 3)
        return 200, result
