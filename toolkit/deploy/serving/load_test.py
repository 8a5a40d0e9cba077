"""An endpoint's latency and throughput as its clients see them: the deployment notebook's figures and the
serving benchmark's come from here.

    body = lambda i: request_body("def ", 16, seed=i)  # request i
    latencies = latencies_s(Client(endpoint), 40, body)
    rate = throughput(endpoint, clients=16, per_client=2, body=body)
"""

from __future__ import annotations

import http.client
import json
import statistics
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Callable


def request_body(prompt: str, max_new_tokens: int, seed: int, **sampling) -> bytes:
    """A generation request (``sampling``: temperature, top_k) as the bytes a client sends."""
    return json.dumps({"prompt": prompt, "max_new_tokens": max_new_tokens, "seed": seed, **sampling}).encode()


class Client:
    """One client with a kept-alive connection, as a real client library (requests.Session) holds one: what is
    measured is the endpoint, not TCP set-up. Calling it sends one request and returns its seconds."""

    def __init__(self, endpoint, timeout: float = 120.0):
        url = urllib.parse.urlsplit(endpoint.scoring_url)
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
        self.path, self.headers = url.path, endpoint.headers()

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
