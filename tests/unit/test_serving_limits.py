"""The endpoint's pure rules: where an HTTP request ends (so a thread only gets whole requests), how many
connections fit the open-file limit, how often a flood is logged, how rows are shared in one forward, who holds
the key, and when binding an address deserves a warning."""

from __future__ import annotations

import resource

import pytest

from toolkit.deploy.serving.batcher import share_rows
from toolkit.deploy.serving.endpoint import plain_http_warning
from toolkit.deploy.serving.protocol import MAX_BODY_BYTES, MAX_HEAD_BYTES
from toolkit.deploy.serving.http_worker import DESCRIPTOR_SPARE, LogThrottle, RequestScan, connection_limit
from toolkit.deploy.serving.service import authorised

READY = RequestScan.READY
HEAD = b"POST /score HTTP/1.1\r\nHost: x\r\n"


def scan(*pieces: bytes, header_timeout: float = 20.0, body_timeout: float = 30.0):
    """Feed ``pieces`` one by one (as a slow client sends them); every outcome."""
    scanner = RequestScan(0.0, header_timeout, body_timeout)
    return scanner, [scanner.feed(piece, now=float(i)) for i, piece in enumerate(pieces)]


@pytest.mark.parametrize("pieces", [
    [HEAD + b"Content-Length: 2\r\n\r\n{}"],
    [b"\r\n" + HEAD + b"\r\n"],  # one empty line before the request is allowed
    [b"GET /score HTTP/1.1\r\n\r\n"],
    [HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"],
    [HEAD + b"Transfer-Encoding: chunked\r\n\r\n1;name=value\r\n{\r\n1\r\n}\r\n0\r\nTrailer: x\r\n\r\n"],
    [HEAD + b"Content-Length: 2, 2\r\n\r\n"],  # framing gunicorn refuses itself, at the end of the head
    [HEAD + b"Content-Length: 2\r\nContent-Length: 2\r\n\r\n"],
    [HEAD + b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"],
    [HEAD + b"Transfer-Encoding: gzip\r\n\r\n"],
])
def test_a_whole_request_is_ready_at_once(pieces):
    assert scan(*pieces)[1][-1] == READY


def test_a_request_sent_byte_by_byte_is_ready_only_at_its_last_byte():
    raw = HEAD + b"Content-Length: 11\r\n\r\n{\"a\": \"bc\"}"
    scanner, outcomes = scan(*[raw[i:i + 1] for i in range(len(raw))])
    assert outcomes[:-1] == [None] * (len(raw) - 1) and outcomes[-1] == READY
    chunked = HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    _, outcomes = scan(*[chunked[i:i + 1] for i in range(len(chunked))])
    assert outcomes[:-1] == [None] * (len(chunked) - 1) and outcomes[-1] == READY


def test_the_head_deadline_is_a_total_and_the_body_gets_its_own():
    scanner, outcomes = scan(b"POST /score HT", b"TP/1.1\r\n", header_timeout=5, body_timeout=7)
    assert outcomes == [None, None] and scanner.deadline == 5  # bytes arriving do not extend it
    status, message = scanner.timed_out()
    assert status == 408 and message.startswith("request:") and "5 s" in message
    scanner, outcomes = scan(HEAD, b"Content-Length: 9\r\n\r\n", b"{}", header_timeout=5, body_timeout=7)
    assert outcomes == [None, None, None] and scanner.deadline == 1 + 7  # from the end of the head
    status, message = scanner.timed_out()
    assert status == 408 and message.startswith("body: 2 bytes arrived in 7 s")


@pytest.mark.parametrize("raw, status, words", [
    (b"A" * (MAX_HEAD_BYTES + 1), 431, "request: headers over"),
    (HEAD + b"X: " + b"y" * MAX_HEAD_BYTES + b"\r\n\r\n", 431, "request: headers over"),
    (b"GET / HTTP/1.1\nHost: x\n\n", 400, "bare LF"),
    (HEAD + b"X: y\n", 400, "bare LF"),
    (HEAD + f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode(), 413, f"body: {MAX_BODY_BYTES + 1:,} bytes"),
    (HEAD + b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n", 413, "body: a 5,000-digit number"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "chunk size 'zz' is not hexadecimal"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n3 \r\nabc\r\n", 400, "is not hexadecimal"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"f" * 20 + b"\r\n", 413, "body:"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n10001\r\n", 413, "body: 65,537 bytes"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n", 400, "longer than its size"),
    (HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + b"1" * 2000, 400, "chunk-size line over"),
    (HEAD + b"Transfer-Encoding: br\r\n\r\n", 400, "Transfer-Encoding: 'br' is not supported"),
])
def test_requests_refused_before_they_reach_a_thread(raw, status, words):
    _, outcomes = scan(raw)
    assert outcomes[-1][0] == status and words in outcomes[-1][1], outcomes[-1]


def test_many_small_chunks_cannot_buffer_more_than_twice_the_body_limit():
    chunks = b"1;" + b"e" * 60 + b"\r\nx\r\n"
    raw = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunks * (2 * MAX_BODY_BYTES // len(chunks) + 2)
    assert scan(raw)[1][-1][0] == 413


def test_expect_100_continue_is_answered_while_the_body_is_awaited():
    scanner, outcomes = scan(HEAD + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert outcomes == [None] and scanner.send_continue
    scanner, outcomes = scan(HEAD + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n{}")
    assert outcomes == [READY] and not scanner.send_continue  # the body is here already
    scanner, outcomes = scan(HEAD + b"Expect: 100-Continue\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert outcomes == [None] and scanner.send_continue
    scanner, _ = scan(b"POST /score HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    assert not scanner.send_continue, "HTTP/1.0 clients do not know 100 Continue (RFC 9110 10.1.1)"


def test_connections_fit_the_open_file_limit():
    assert connection_limit(1000, 1100, 40) == 1000
    assert connection_limit(1000, 1024, 40) == 1024 - 40 - DESCRIPTOR_SPARE, "ulimit -n 1024: fewer connections"
    assert connection_limit(1000, 30, 40) == 1, "no room at all: one connection, not none or a negative count"
    assert connection_limit(1000, resource.RLIM_INFINITY, 40) == 1000


def test_a_flood_is_logged_as_a_few_lines_and_a_count():
    lines: list[str] = []
    throttle = LogThrottle(lambda message, *args: lines.append(message % args), window_s=10, burst=2,
                           summary="%d more refused in %g s")
    for i in range(1000):
        throttle(i / 1000, "refused %d", i)
    assert lines == ["refused 0", "refused 1"]
    throttle.flush(9.9)
    assert len(lines) == 2, "the count waits for the window's end"
    throttle.flush(10.0)
    assert lines[2:] == ["998 more refused in 10 s"]
    throttle(30.0, "refused %d", 1000)
    throttle.flush(40.0)
    assert lines[3:] == ["refused 1000"], "a quiet window ends without a count"


@pytest.mark.parametrize("wants, budget, first, given", [
    ([1] * 16, 64, 0, [1] * 16),
    ([529] * 16, 64, 0, [4] * 16),
    ([529, 1, 1, 1], 64, 0, [61, 1, 1, 1]),  # what the short jobs leave goes to the long one
    ([3, 100, 100], 64, 0, [3, 31, 30]),
    ([1] * 5, 3, 0, [1, 1, 1, 0, 0]),
    ([1] * 5, 3, 3, [1, 0, 0, 1, 1]),  # more jobs than rows: whose turn it is goes first
    ([], 64, 0, []),
    ([0, 5], 64, 0, [0, 5]),
])
def test_rows_are_shared_within_the_cap(wants, budget, first, given):
    got = share_rows(wants, budget, first)
    assert got == given and sum(got) <= budget and all(g <= w for g, w in zip(got, wants))


@pytest.mark.parametrize("header, ok", [
    ("Bearer sekrit", True), ("bearer sekrit", True), ("BEARER sekrit", True), ("Bearer   sekrit ", True),
    (None, False), ("", False), ("Bearer", False), ("Bearer ", False), ("Basic sekrit", False),
    ("Bearer sekrit2", False), ("Bearer sekrit, Bearer sekrit", False), ("Bearer s\u00e9krit", False),
    ("Bearersekrit", False),
])
def test_the_key_check(header, ok):
    assert authorised("sekrit", header) is ok
    assert authorised(None, header), "no key configured: Azure ML checked the key before the request came"


@pytest.mark.parametrize("host, warned", [
    ("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False),
    ("0.0.0.0", True), ("::", True), ("192.168.1.20", True), ("10.0.0.1", True), ("myhost.example", True),
])
def test_binding_beyond_loopback_warns_that_the_key_travels_in_the_clear(host, warned):
    message = plain_http_warning(host)
    assert (message is not None) is warned
    if warned:
        assert host in message and "plain HTTP" in message and "key" in message
