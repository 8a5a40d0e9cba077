"""An endpoint's latency and throughput as its clients see them: the deployment notebook's figures and the
serving benchmark's come from here.

    body = lambda i: request_body("def ", 16, seed=i)  # request i
    latencies = latencies_s(Client(endpoint), 40, body)
    rate = throughput(endpoint, clients=16, per_client=2, body=body)
    result = measure_endpoint(endpoint, "def ", max_new_tokens=16, requests=40)  # both, as the notebook shows them
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from collections.abc import Callable


def request_body(prompt: str, max_new_tokens: int, seed: int, **sampling) -> bytes:
    """A generation request (``sampling``: temperature, top_k) as the bytes a client sends."""
    return json.dumps({"prompt": prompt, "max_new_tokens": max_new_tokens, "seed": seed, **sampling}).encode()


class Client:
    """One client with a kept-alive connection, as a real client library (requests.Session) holds one: what is
    measured is the endpoint, not TCP set-up. Calling it sends one request and returns its seconds."""

    def __init__(self, endpoint, timeout: float = 120.0, path: str | None = None):
        """``path``: where it POSTs (default: the scoring route; '/v1/completions' for OpenAI's)."""
        url = urllib.parse.urlsplit(endpoint.scoring_url)
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
        self.path, self.headers = path or url.path, endpoint.headers()

    def __call__(self, data: bytes) -> float:
        t0 = time.perf_counter()
        self.connection.request("POST", self.path, body=data, headers=self.headers)
        response = self.connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {answer[:200]!r}")
        return time.perf_counter() - t0

    def close(self) -> None:
        self.connection.close()


def latencies_s(call: Callable[[bytes], float], n: int, body: Callable[[int], bytes]) -> list[float]:
    """``n`` requests one after another (request i is ``body(i)``): the seconds of each."""
    return [call(body(i)) for i in range(n)]


def throughput(endpoint, clients: int, per_client: int, body: Callable[[int], bytes]) -> float:
    """Requests per second with ``clients`` threads, each with its own connection, sending ``per_client``
    requests back to back (client c's request i is ``body(c * 1000 + i)``)."""

    def client(c: int) -> None:
        call = Client(endpoint)
        try:
            for i in range(per_client):
                call(body(c * 1000 + i))
        finally:
            call.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    return clients * per_client / (time.perf_counter() - t0)


def percentile_ms(seconds: list[float], q: int) -> float:
    """The q-th percentile of ``seconds``, in milliseconds."""
    if len(seconds) == 1:
        return seconds[0] * 1000
    return statistics.quantiles(seconds, n=100, method="inclusive")[q - 1] * 1000


@dataclass(frozen=True)
class LoadTestResult:
    """What one client sees one request at a time, and what many concurrent clients get through together."""

    latencies_s: list[float]  # one per sequential request
    clients: int  # the concurrent clients of the throughput phase
    requests_per_s: float  # with ``clients`` concurrent clients

    @property
    def p50_ms(self) -> float:
        return percentile_ms(self.latencies_s, 50)

    def summary(self) -> str:
        return (
            f"one at a time: p50 {self.p50_ms:.1f} ms; {self.clients} concurrent clients: "
            f"{self.requests_per_s:.1f} requests/s"
        )


def measure_endpoint(
    endpoint, prompt: str, max_new_tokens: int, requests: int, clients: int = 16, per_client: int = 2
) -> LoadTestResult:
    """``requests`` generation requests one after another on one kept-alive connection, then ``clients``
    concurrent clients sending ``per_client`` each; request i asks for ``max_new_tokens`` with seed i."""

    def body(i: int) -> bytes:
        return request_body(prompt, max_new_tokens, seed=i)

    client = Client(endpoint)
    try:
        seconds = latencies_s(client, requests, body)
    finally:
        client.close()
    return LoadTestResult(seconds, clients, throughput(endpoint, clients, per_client, body))
