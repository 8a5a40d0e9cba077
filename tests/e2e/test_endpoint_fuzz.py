"""The endpoint under hostile clients, against one real server on 127.0.0.1: a generated corpus of a few hundred
malformed requests, slow and idle connections, long texts to score, clients that hang up. Every complete
request gets a 4xx (never a 5xx, never a connection closed without an answer); the server keeps answering good
requests in normal time and its resident memory stays within RSS_GROWTH_LIMIT_MB.

Reusable: the corpus is generated from a fixed seed, bounded in count (CORPUS_SIZE) and time (each exchange
has a timeout), and goes only to 127.0.0.1. Add a case to ``corpus()`` to keep a new bad input refused."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from toolkit.deploy.serving.batcher import Batcher
from toolkit.runs.service import ServiceProcess
from toolkit.deploy.serving.endpoint import LocalEndpoint, serve
from toolkit.deploy.serving.protocol import MAX_BODY_BYTES, MAX_TEXT_BYTES, RequestError, ScoreRequest, parse
from toolkit.deploy.serving.runtimes import load_runtime

from conftest import PROJECT
from served_model import exported_tiny_model

HEADER_TIMEOUT, BODY_TIMEOUT = 2.0, 3.0  # short, so that slow clients' fate shows within the test
ANSWER_WITHIN_S = 10.0  # a generous bound for a good request's answer (it takes milliseconds when all is well)
RSS_GROWTH_LIMIT_MB = 100  # the 16 x 16 KB scoring case grew the server by 580 MB when forwards were uncapped


@pytest.fixture(scope="module")
def model_dir(finished_runs):
    return exported_tiny_model(finished_runs)


@pytest.fixture(scope="module")
def endpoint(model_dir, tmp_path_factory):
    with serve(model_dir, workspace=tmp_path_factory.mktemp("ws"), header_timeout=HEADER_TIMEOUT,
               body_timeout=BODY_TIMEOUT) as ep:
        yield ep


def address(endpoint) -> tuple[str, int]:
    host, port = endpoint.url.removeprefix("http://").split(":")
    assert host == "127.0.0.1"
    return host, int(port)


def exchange(endpoint, raw: bytes, method: str = "POST", half_close: bool = False,
             timeout: float = ANSWER_WITHIN_S) -> tuple[int | None, bytes]:
    """Send ``raw`` on a new connection and read one response: (status, body), or (None, b"") when the server
    closed the connection without answering. No answer within ``timeout`` raises."""
    with socket.create_connection(address(endpoint), timeout=timeout) as sock:
        try:
            sock.sendall(raw)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it was all sent: the answer may still be there to read
        response = http.client.HTTPResponse(sock, method=method)
        try:
            response.begin()
            return response.status, response.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, http.client.IncompleteRead):
            return None, b""


def good(endpoint, timeout: float = ANSWER_WITHIN_S) -> tuple[int, float]:
    started = time.perf_counter()
    status, _ = endpoint.request({"prompt": "def ", "max_new_tokens": 4}, timeout=timeout)
    return status, time.perf_counter() - started


def readiness(endpoint, headers: dict | None = None) -> dict:
    request = urllib.request.Request(endpoint.scoring_url, headers=endpoint.headers() if headers is None else headers)
    with urllib.request.urlopen(request, timeout=ANSWER_WITHIN_S) as response:
        return json.loads(response.read())


def server_rss_mb(endpoint) -> float:
    """Resident memory of the server's process tree (gunicorn's master and its worker), in MiB."""
    pid = endpoint.process.pid
    pids = [pid, *map(int, Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
    kib = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                kib += int(line.split()[1])
    return kib / 1024


# ----------------------------------------------------------------------------------------------- the corpus


def request(body: bytes | str | dict | None = b"", *, key: str | None, method: str = "POST", target: str = "/score",
            version: str = "HTTP/1.1", headers: list[tuple[str, str]] | None = None, length: bool = True) -> bytes:
    """Raw HTTP/1.1 bytes, assembled by hand so that any part of them can be wrong."""
    if isinstance(body, dict):
        body = json.dumps(body)
    body = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else (body or b"")
    lines = [f"{method} {target} {version}", "Host: 127.0.0.1"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    lines += [f"{name}: {value}" for name, value in headers or []]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return "\r\n".join(lines).encode("latin-1", "surrogateescape") + b"\r\n\r\n" + body


def json_value_cases() -> list[tuple[str, str]]:
    """Every field with values of the wrong type, out of range, at odd boundaries, or odd text."""
    wrong_types = ["true", "false", "[]", "{}", "[1]", '{"a": 1}', "[[[[[[[[[[]]]]]]]]]]"]
    ints = wrong_types + ["null", "-1", "1.5", "1e3", "-0.0", str(2**63), str(-2**63 - 1), "9" * 5000, "NaN",
                          "Infinity", '"3"', '"\\ud800"']
    texts = ["null", "0", "-1", "1.5", "true", "[]", "{}", '["x"]', '""', '"\\ud800"', '"x\\udfffy"',
             '"\\udc00\\ud800"', "9" * 5000]
    fields = {"max_new_tokens": ints + ["0", "513"], "top_k": ints + ["257"], "seed": [v for v in ints if v != "null"],
              "temperature": wrong_types + ["null", "-0.01", "5.01", "1e309", "-1e309", "NaN", "Infinity", "9" * 5000],
              "prompt": texts + [json.dumps("x" * 4097)], "task": texts + ['"Score"', '" score"', '"generate\\u0000"']}
    cases = [(f"{field}={value[:24]}", f'{{"prompt": "x", "{field}": {value}}}' if field != "prompt"
              else f'{{"prompt": {value}}}') for field, values in fields.items() for value in values]
    cases += [(f"score text={value[:24]}", f'{{"task": "score", "text": {value}}}')
              for value in texts + [json.dumps("x" * (MAX_TEXT_BYTES + 1))]]
    return cases


def body_cases() -> list[tuple[str, bytes]]:
    deep = b"[" * 30000 + b"]" * 30000
    return [
        ("empty body", b""), ("whitespace body", b"  \r\n\t "), ("not JSON", b"{prompt: 'x'}"),
        ("truncated JSON", b'{"prompt": "de'), ("trailing comma", b'{"prompt": "x",}'), ("JSON array", b"[1, 2]"),
        ("JSON string", b'"def "'), ("JSON number", b"42"), ("JSON null", b"null"), ("JSON true", b"true"),
        ("deep nesting", deep), ("deep nesting in a field", b'{"prompt": ' + deep[:40000] + b"}"),
        ("duplicate field", b'{"prompt": "x", "prompt": "y"}'), ("NUL bytes", b"\x00" * 64),
        ("invalid UTF-8", b'{"prompt": "\xff\xfe"}'), ("UTF-16 JSON", '{"prompt": "x"}'.encode("utf-16")),
        ("UTF-8 BOM", b'\xef\xbb\xbf{"prompt": "x"}'), ("two objects", b'{"prompt": "x"}{"prompt": "y"}'),
        ("unknown field", b'{"prompt": "x", "beam": 4}'), ("huge unknown field", b'{"prompt": "x", "' + b"k" * 60000
                                                                                  + b'": 1}'),
        ("odd unicode field", '{"prompt": "x", "\u202e\u0000\U0001F600": 1}'.encode()),
        ("over the body limit", b"{" + b" " * MAX_BODY_BYTES + b"}"),
        ("5000-digit seed", b'{"prompt": "x", "seed": ' + b"9" * 5000 + b"}"),
    ]


def mutated_bodies(rng: random.Random, count: int) -> list[tuple[str, bytes]]:
    """Random byte flips, cuts and insertions in good bodies, kept only where they make the body invalid."""
    originals = [b'{"prompt": "def ", "max_new_tokens": 8, "temperature": 0.5, "top_k": 5, "seed": 3}',
                 b'{"task": "score", "text": "The quick brown fox"}']
    found: list[tuple[str, bytes]] = []
    while len(found) < count:
        body = bytearray(rng.choice(originals))
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(len(body))
            action = rng.choice(["flip", "cut", "insert"])
            if action == "flip":
                body[at] = rng.randrange(256)
            elif action == "cut":
                del body[at:at + rng.randint(1, 8)]
            else:
                body[at:at] = rng.choice([b'"', b"{", b"]", b"\\", b"\\u", b"-", b"1e999", b"\x00", b"\xc3"])
        try:
            parse(bytes(body))
        except RequestError:
            found.append((f"mutation {len(found)}", bytes(body)))
    return found


def corpus(key: str, rng: random.Random) -> list[tuple[str, bytes, str, str]]:
    """(what, raw bytes, method, expected): "4xx" for a complete request, "4xx or close" for bytes that never
    make one (the server may answer 408 or 400, or close)."""
    ok = {"prompt": "def ", "max_new_tokens": 2}
    cases = [(what, request(body, key=key), "POST", "4xx") for what, body in json_value_cases() + body_cases()
             + mutated_bodies(rng, 40)]
    cases += [(f"method {m}", request(ok, key=key, method=m), m, "4xx")
              for m in ["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "HEAD", "post", "P0ST", "FOO", "M" * 300]]
    cases += [(f"target {t[:20]}", request(ok, key=key, target=t), "POST", "4xx")
              for t in ["/nowhere", "/score/", "/Score", "/score%00", "*", "/" + "a" * 5000, "/\x7f", "/sc\tore"]]
    cases += [(f"version {v}", request(ok, key=key, version=v), "POST", "4xx")
              for v in ["HTTP/2.0", "HTTP/3.0", "HTTP/0.9", "HTTP/1", "http/1.1", "HTTP/1.1 x", "HTTP/11.1",
                        "HTTPS/1.1", ""]]
    auth = ["Bearer", "Bearer ", "Basic " + key, "Bearer wrong", f"Bearer {key} extra", f"Bearer {key}x",
            "Bearer " + "k" * 9000, "Bearer \u00e9\u00e8", f"Token {key}", key, f"Bearer\t{key}x"]
    cases += [(f"authorization {a[:20]}", request(ok, key=None, headers=[("Authorization", a)]), "POST", "4xx")
              for a in auth]
    cases += [("no key", request(ok, key=None), "POST", "4xx"),
              ("two keys", request(ok, key=key, headers=[("Authorization", f"Bearer {key}")]), "POST", "4xx"),
              ("key on GET elsewhere", request(None, key=key, method="GET", target="/nowhere"), "GET", "4xx")]
    bad_headers = [[("X No Colon", "")], [("", "empty name")], [("Bad Name", "x")], [("X", "a\x00b")],
                   [("X-Request-Id", "r" * 300)], [("X-Ms-Client-Request-Id", "r" * 300)],
                   [(f"X-{i}", "y") for i in range(120)], [("Host", "a"), ("Host", "b")],
                   [("X", "folded"), (" continued", "line")], [("Expect", "200-ok")], [("X", "y" * 9000)]]
    cases += [(f"header {h[0][0][:12]!r}", request(ok, key=key, headers=h).replace(b"X No Colon: ", b"X No Colon"),
               "POST", "4xx") for h in bad_headers]
    body = json.dumps(ok).encode()
    lengths = ["abc", "-1", "+5", "0x10", "1e3", "5, 5", "1" * 30, "9" * 5000, str(MAX_BODY_BYTES + 1), "3.0"]
    cases += [(f"Content-Length {v[:12]}", request(body, key=key, length=False, headers=[("Content-Length", v)]),
               "POST", "4xx") for v in lengths]
    cases += [("two Content-Lengths", request(body, key=key, headers=[("Content-Length", "3")]), "POST", "4xx"),
              ("Content-Length 0 with a body", request(body, key=key, length=False,
                                                       headers=[("Content-Length", "0")]), "POST", "4xx"),
              ("Content-Length short", request(body, key=key, length=False,
                                               headers=[("Content-Length", str(len(body) - 4))]), "POST", "4xx"),
              ("Content-Length long, body never completes", request(body, key=key, length=False,
                                                                    headers=[("Content-Length", str(len(body) + 9))]),
               "POST", "4xx")]
    chunked = [("bad size", b"zz\r\n{}\r\n0\r\n\r\n"), ("size too big", b"ffffffffffffffffffff\r\n"),
               ("missing CRLF", b"2\r\n{}0\r\n\r\n"), ("short chunk", b"9\r\n{}\r\n0\r\n\r\n"),
               ("bad extension", b"2;\x01\r\n{}\r\n0\r\n\r\n"), ("no last chunk", b"2\r\n{}\r\n"),
               ("invalid JSON", b"2\r\n{x\r\n0\r\n\r\n"), ("bad trailer", b"2\r\n{}\r\n0\r\nBad Trailer\r\n\r\n"),
               ("space in size", b"2 \r\n{}\r\n0\r\n\r\n")]
    cases += [(f"chunked {what}", request(raw, key=key, length=False, headers=[("Transfer-Encoding", "chunked")]),
               "POST", "4xx") for what, raw in chunked]
    codings = ["gzip", "br", "chunked, chunked", "chunked, gzip", "identity", "foo", "chunked\x00"]
    cases += [(f"Transfer-Encoding {c}", request(b"2\r\n{}\r\n0\r\n\r\n", key=key, length=False,
                                                 headers=[("Transfer-Encoding", c)]), "POST", "4xx") for c in codings]
    cases += [("chunked and Content-Length", request(b"2\r\n{}\r\n0\r\n\r\n", key=key, headers=[
        ("Transfer-Encoding", "chunked")]), "POST", "4xx"),
              ("chunked on HTTP/1.0", request(b"2\r\n{}\r\n0\r\n\r\n", key=key, length=False, version="HTTP/1.0",
                                              headers=[("Transfer-Encoding", "chunked")]), "POST", "4xx")]
    garbage = [bytes(rng.randrange(256) for _ in range(rng.choice([1, 10, 100, 1000, 3000]))) for _ in range(30)]
    garbage += [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(200),  # a TLS ClientHello
                b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", b"\r\n\r\n", b"\x00" * 100, b"A" * 20000,
                b"GET / HTTP/1.1\r\nX: " + b"y" * 20000, b"GET /\n\n", b"\r\n" * 50]
    cases += [(f"garbage {i}", raw, "POST", "4xx or close") for i, raw in enumerate(garbage)]
    whole = request({"prompt": "def ", "max_new_tokens": 2}, key=key)
    cases += [(f"cut at {at}", whole[:at], "POST", "4xx or close") for at in sorted(rng.sample(range(1, len(whole)), 12))]
    return cases


CORPUS_SIZE = len(corpus("k" * 43, random.Random(0)))  # the same for every seed: each part draws a fixed count


def test_a_corpus_of_malformed_requests_gets_4xx_and_the_server_stays_well(endpoint, rng):
    assert 300 <= CORPUS_SIZE <= 500, "bounded, and a few hundred"
    rss_before = server_rss_mb(endpoint)
    log_before = endpoint.log_path.stat().st_size
    cases = corpus(endpoint.key, rng)

    def send(i: int):
        what, raw, method, expected = cases[i]
        half_close = expected == "4xx or close" and i % 2 == 0  # both kinds: a client that waits, one that gives up
        return what, expected, exchange(endpoint, raw, method, half_close=half_close)

    started = time.monotonic()
    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(send, range(len(cases))))
    assert time.monotonic() - started < 60
    wrong = [(what, status, answer[:200]) for what, expected, (status, answer) in results
             if not (status is not None and 400 <= status < 500 or expected == "4xx or close" and status is None)]
    assert not wrong, f"{len(wrong)} of {len(cases)} not answered with a 4xx: {wrong}"
    assert endpoint.process.poll() is None, "the server is up"
    status, seconds = good(endpoint)
    assert status == 200 and seconds < ANSWER_WITHIN_S
    assert server_rss_mb(endpoint) - rss_before < RSS_GROWTH_LIMIT_MB
    with endpoint.log_path.open("rb") as log:
        log.seek(log_before)
        assert b"Traceback" not in log.read(), "no request failed inside the server"


def test_slow_and_idle_clients_do_not_hold_the_server(endpoint):
    """200 connections that send half a header, trickle a body, or send nothing at all; and 10 answered with
    'Connection: close' whose clients never close (gunicorn lingers up to 2 s for each, in its event loop)."""
    host_port = address(endpoint)
    half_header = b"POST /score HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"
    trickle_head = request(None, key=endpoint.key, length=False, headers=[("Content-Length", "10000")])
    groups: dict[str, list[socket.socket]] = {"half header": [], "trickle": [], "idle": [], "never closes": []}
    for i in range(210):
        sock = socket.create_connection(host_port, timeout=HEADER_TIMEOUT + BODY_TIMEOUT + 5)
        if i >= 200:
            sock.sendall(request({}, key=None, headers=[("Connection", "close")]))
            groups["never closes"].append(sock)
        elif i % 3 == 0:
            sock.sendall(half_header)
            groups["half header"].append(sock)
        elif i % 3 == 1:
            sock.sendall(trickle_head + b'{"prompt": ')
            groups["trickle"].append(sock)
        else:
            groups["idle"].append(sock)
    stop = threading.Event()

    def trickle():
        while not stop.wait(0.2):  # a byte every 200 ms: each read arrives well within any per-read timeout
            for sock in groups["trickle"]:
                try:
                    sock.send(b" ")
                except OSError:
                    pass

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        status, seconds = good(endpoint)
        assert status == 200 and seconds < ANSWER_WITHIN_S, "a good client is answered while 200 others dawdle"
        for what, socks in groups.items():  # each one is answered or closed: nobody holds a connection for ever
            for sock in socks:
                response = http.client.HTTPResponse(sock)
                response.begin()
                answer = json.loads(response.read())
                expected = {"half header": (408, "request:"), "idle": (408, "request:"), "trickle": (408, "body:"),
                            "never closes": (401, "Authorization:")}[what]
                assert (response.status, answer["error"].split(" ")[0]) == (expected[0], expected[1]), (what, answer)
    finally:
        stop.set()
        trickler.join()
        for socks in groups.values():
            for sock in socks:
                sock.close()
    assert endpoint.process.poll() is None
    assert good(endpoint)[0] == 200


def test_long_texts_are_scored_in_capped_forwards_with_the_same_answers(endpoint, model_dir):
    """16 concurrent 16 KB texts: 8,464 windows of the 32-byte context. Each forward takes at most the cap of
    rows, the log-likelihoods equal those of one uncapped forward per text, and memory stays bounded."""
    texts = [(f"{i} The quick brown fox jumps over the lazy dog. " * 400)[:MAX_TEXT_BYTES] for i in range(16)]
    rss_before = server_rss_mb(endpoint)
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda t: endpoint.request({"task": "score", "text": t}, timeout=120), texts))
    assert [status for status, _ in answers] == [200] * 16, answers[0]
    growth = server_rss_mb(endpoint) - rss_before
    assert growth < RSS_GROWTH_LIMIT_MB, f"the server grew by {growth:.0f} MB"
    stats = readiness(endpoint)
    assert stats["largest_forward_rows"] <= stats["max_rows_per_forward"] < 16 * 529, stats
    uncapped = Batcher(load_runtime(model_dir, "onnx"), max_rows=10**9)
    for text, (_, answer) in zip(texts[:4], answers):
        reference = uncapped.submit(ScoreRequest(text.encode())).result(timeout=60)
        assert answer["predicted_bytes"] == reference["predicted_bytes"] == len(text) - 1
        assert answer["log_likelihood"] == pytest.approx(reference["log_likelihood"], rel=1e-5)


def gone(stats: dict) -> int:
    """Requests that have left the batcher, answered or dropped."""
    return stats.get("answered", 0) + stats.get("dropped", 0)


def test_work_whose_client_hung_up_is_dropped(endpoint):
    """32 long texts whose clients close the connection as soon as they have sent them: the batcher drops their
    work instead of scoring all 16,928 windows for nobody."""
    before = readiness(endpoint)
    text = ("Tell me about the lazy dog. " * 600)[:MAX_TEXT_BYTES]
    raw = request({"task": "score", "text": text}, key=endpoint.key)
    socks = [socket.create_connection(address(endpoint), timeout=10) for _ in range(32)]
    for sock in socks:
        sock.sendall(raw)
    for sock in socks:
        sock.close()
    deadline, stats = time.monotonic() + 60, readiness(endpoint)
    # until all 32 have left the batcher, or all their work is done
    while gone(stats) - gone(before) < 32 and stats["rows"] - before["rows"] < 32 * 529 \
            and time.monotonic() < deadline:
        time.sleep(0.2)  # another process's state: nothing to wait on but its readiness answer
        stats = readiness(endpoint)
    scored = stats["rows"] - before["rows"]
    assert scored < 32 * 529 / 2, f"{scored} windows scored for clients that had gone"
    assert stats["dropped"] > before["dropped"]
    assert good(endpoint)[0] == 200


def test_readiness_tells_details_only_to_the_key_and_the_scheme_is_case_insensitive(endpoint):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": endpoint.key}):
        assert readiness(endpoint, headers) == {"ready": True}
    details = readiness(endpoint)
    assert details["ready"] and details["run"] and details["step"] and "rows" in details
    for scheme in ("bearer", "BEARER", "Bearer  "):
        headers = {"Authorization": f"{scheme} {endpoint.key}", "Content-Type": "application/json"}
        assert endpoint.request({"prompt": "def ", "max_new_tokens": 2}, headers=headers)[0] == 200, scheme


def read_responses(sock: socket.socket, count: int) -> list[tuple[int, dict]]:
    """``count`` final responses from one connection (1xx skipped), as (status, JSON)."""
    buf, responses = b"", []
    while len(responses) < count:
        head_end = buf.find(b"\r\n\r\n")
        if head_end >= 0:
            head = buf[:head_end].decode("latin-1").split("\r\n")
            length = next((int(line.split(":")[1]) for line in head if line.lower().startswith("content-length:")), 0)
            if len(buf) >= head_end + 4 + length:
                status = int(head[0].split()[1])
                if status >= 200:
                    responses.append((status, json.loads(buf[head_end + 4:head_end + 4 + length])))
                buf = buf[head_end + 4 + length:]
                continue
        data = sock.recv(65536)
        assert data, f"the connection closed after {len(responses)} of {count} responses"
        buf += data
    return responses


def test_well_formed_requests_of_every_framing_are_served(endpoint):
    """Reading requests in the event loop must not lose legitimate HTTP/1.1: chunked bodies, Expect:
    100-continue, pipelined requests, several requests on one kept-alive connection."""
    body = json.dumps({"prompt": "def ", "max_new_tokens": 2}).encode()
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (5, body[:5], len(body) - 5, body[5:])
    with socket.create_connection(address(endpoint), timeout=ANSWER_WITHIN_S) as sock:
        sock.sendall(request(chunked, key=endpoint.key, length=False, headers=[("Transfer-Encoding", "chunked")]))
        assert read_responses(sock, 1)[0][0] == 200, "chunked"
        sock.sendall(request(body, key=endpoint.key) * 3)  # pipelined
        assert [status for status, _ in read_responses(sock, 3)] == [200] * 3, "pipelined, on a kept-alive connection"
        sock.sendall(request(None, key=endpoint.key, length=False, headers=[("Expect", "100-continue"),
                                                                            ("Content-Length", str(len(body)))]))
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), "the client is told to send its body"
        sock.sendall(body)
        assert read_responses(sock, 1)[0][0] == 200, "after 100-continue"


# -------------------------------------------------------------------------- a flood under a low open-file limit

SERVER_OPEN_FILES = 256  # the server's open-file limit, soft and hard, as under `ulimit -n 256`: serve() cannot
# raise it, so a flood of held connections (FLOOD_HELD, more than the limit) really runs the server out
FLOOD_HELD = 600
FLOOD_S = 6.0
FLOOD_LOG_LIMIT = 32 * 1024  # one line per refusal and per failed accept grew a server's log by 7.7 MB in 15 s
GOOD_REQUEST_LINES = ("POST /score", "run() output is HTTP Response")  # what each good request logs


@contextlib.contextmanager
def endpoint_under_file_limit(model_dir: Path, workspace: Path, limit: int):
    """A local endpoint started by a process whose open-file limit (soft and hard) is ``limit``; the server
    inherits it. The starter stops the server when its stdin closes (and the server stops if the starter dies)."""
    code = ("import json, resource, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); "
            "from toolkit.deploy.serving.endpoint import serve; "
            f"ep = serve({str(model_dir)!r}, workspace={str(workspace)!r}, header_timeout={HEADER_TIMEOUT}, "
            f"body_timeout={BODY_TIMEOUT}); "
            "print(json.dumps({'url': ep.url, 'key': ep.key, 'folder': str(ep.folder)}), flush=True); "
            "sys.stdin.read(); ep.stop()")
    starter = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, cwd=PROJECT)
    try:
        info = json.loads(starter.stdout.readline() or "null")
        assert info, "the endpoint did not start"
        # a client's handle on the starter's server: request() and log_path, never stop()
        folder = Path(info["folder"])
        yield LocalEndpoint("flooded", info["url"], info["key"], "onnx", model_dir, folder,
                            ServiceProcess(starter, folder / "server.log"))
    finally:
        starter.stdin.close()
        try:
            starter.wait(timeout=30)
        except subprocess.TimeoutExpired:
            starter.kill()  # its server stops with it (parent watch)
            starter.wait()


def flood_bare_lf(host_port: tuple[str, int], until: float, held: int, opened: list) -> None:
    """Connections that each send a request with bare-LF line ends (refused at once with 400) and never close,
    up to ``held`` open at a time (the oldest closed beyond): every refused one lingers on the server. Appends
    to ``opened`` the number of connections made."""
    socks: list[socket.socket] = []
    try:
        while time.monotonic() < until:
            with contextlib.suppress(OSError):  # the server's backlog may be full for a moment
                sock = socket.create_connection(host_port, timeout=5)
                socks.append(sock)
                sock.sendall(b"GET / HTTP/1.1\nHost: x\n\n")
            if len(socks) > held:
                socks.pop(0).close()
    finally:
        opened.append(len(socks))
        for sock in socks:
            sock.close()


def test_a_flood_of_refused_connections_held_open_cannot_exhaust_descriptors(model_dir, tmp_path):
    """Refused connections whose clients never close, more at once than the server's open-file limit: the
    server keeps answering good requests, and the flood costs a few log lines, not one per refusal or per
    failed accept."""
    with endpoint_under_file_limit(model_dir, tmp_path / "ws", SERVER_OPEN_FILES) as endpoint:
        log_before = endpoint.log_path.stat().st_size
        until, held_at_the_end = time.monotonic() + FLOOD_S, []
        flooders = [threading.Thread(target=flood_bare_lf, args=(address(endpoint), until, FLOOD_HELD // 2,
                                                                 held_at_the_end)) for _ in range(2)]
        for flooder in flooders:
            flooder.start()
        try:
            answers = []
            while time.monotonic() < until:
                answers.append(good(endpoint))
        finally:
            for flooder in flooders:
                flooder.join()
        assert sum(held_at_the_end) > SERVER_OPEN_FILES, "the flood held more connections than the server can"
        assert answers and all(status == 200 for status, _ in answers), answers
        assert good(endpoint)[0] == 200
        with endpoint.log_path.open("rb") as log:
            log.seek(log_before)
            text = log.read().decode(errors="replace")
        assert "Traceback" not in text and "Booting worker" not in text, "the worker ran on, without an error"
        flood_lines = "\n".join(line for line in text.splitlines() if not any(g in line for g in GOOD_REQUEST_LINES))
        assert len(flood_lines) < FLOOD_LOG_LIMIT, (f"the flood logged {len(flood_lines):,} characters: "
                                                    f"{flood_lines.count('Too many open files')} 'Too many open "
                                                    f"files', {flood_lines.count(' 400 ')} refusals")
