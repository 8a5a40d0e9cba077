"""A gunicorn worker that no slow client can starve: a pool thread only ever gets a request that has fully arrived.

gunicorn's gthread worker reads a request inside a pool thread, blocking: 32 clients that send half a header
hold all 32 threads forever, and a connection that sends nothing holds one for 5 s. :class:`WholeRequestWorker`
reads every request in its event loop without blocking (:class:`RequestScan` finds where it ends) and gives a
thread only a complete request. A client that has not sent its head within HEADER_TIMEOUT_S, or its body within
BODY_TIMEOUT_S of the head, gets 408. A graceful close (gunicorn's blocks its event loop for up to 2 s per
connection whose client does not close) lingers without blocking.

What a slow client costs now: one open connection of at most WORKER_CONNECTIONS, for at most the timeouts above.
Every open socket counts as a connection, lingering ones too (at most a quarter of the connections linger; beyond
that the oldest closes at once), and the limit fits the open-file limit, so the worker does not run out of
descriptors: a server started under a low ``ulimit -n`` takes fewer connections instead. A flood of refused
requests costs a few log lines, not one each. A client that opens every connection still delays others by up to
HEADER_TIMEOUT_S: limiting connections per client address would be the next step.

It builds on gunicorn's gthread internals (TConn, the poller, murder_pending), pinned by constraints.txt; the
request scanner's unit tests and the endpoint fuzz test are what tell when a gunicorn upgrade breaks it.
"""

from __future__ import annotations

import errno
import http as http_status
import json
import os
import re
import resource
import selectors
import socket
import time
from functools import partial

from gunicorn import http as gunicorn_http
from gunicorn import util
from gunicorn.workers.gthread import TConn, ThreadWorker

from toolkit.deploy.serving.options import ServingOptions
from toolkit.deploy.serving.protocol import (
    BODY_TIMEOUT_S,
    HEADER_TIMEOUT_S,
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    body_too_large,
    error_body,
)
from toolkit.errors import not_allowed, refused

WORKER_CONNECTIONS = 1000  # gunicorn's default: open connections (reading, waiting or kept alive) at once
GUNICORN_ARGS = [
    "--no-control-socket",
    "--worker-class",
    "toolkit.deploy.serving.http_worker.WholeRequestWorker",
    "--worker-connections",
    str(WORKER_CONNECTIONS),
]
READ_CHUNK = 64 * 1024
MAX_CHUNK_LINE = 1024  # a chunk-size line with extensions; gunicorn's own limit is larger
MAX_CHUNKED_BYTES = 2 * MAX_BODY_BYTES  # a chunked body as sent, framing included
THREAD_IO_TIMEOUT_S = 10.0  # a thread's socket reads and writes: it only reads what is already buffered
LINGER_S = 2.0  # gunicorn's own graceful-close time
LINGER_MAX_BYTES = 1024 * 1024  # read and dropped after a refusal, so the refusal is not lost to a reset
# at most 1/LINGER_SHARE of the connections linger: refused clients that never close cannot hold them all
LINGER_SHARE = 4
DESCRIPTOR_SPARE = 16  # left free beyond the connections and what the worker holds open when it starts serving
ACCEPT_PAUSE_S = 0.5  # out of descriptors all the same (something else took them): wait before trying again
LOG_WINDOW_S = 10.0
REFUSALS_LOGGED = 20  # refusals logged one by one per LOG_WINDOW_S; the rest as one count
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
TRANSFER_CODINGS = {b"chunked", b"identity", b"gzip", b"deflate", b"compress"}  # the ones gunicorn knows
BARE_LF = re.compile(rb"(?<!\r)\n")


class RequestScan:
    """Where one HTTP/1.1 request ends (RFC 9112), found in the bytes received so far, incrementally.

    :meth:`feed` answers None (the request is not complete yet), READY (everything a thread needs is here), or
    (status, message) for a request refused before it reaches the application. Framing gunicorn rejects
    itself (duplicate or non-numeric Content-Length, Content-Length with Transfer-Encoding) is READY at the end
    of the head: gunicorn answers 400 without reading further. Timeouts are totals, not per-read limits, so a
    client trickling a byte at a time gains nothing."""

    READY = "ready"

    def __init__(self, now: float, header_timeout: float = HEADER_TIMEOUT_S, body_timeout: float = BODY_TIMEOUT_S):
        self.buf = bytearray()
        self.header_timeout, self.body_timeout = header_timeout, body_timeout
        self.deadline = now + header_timeout
        self.head_end: int | None = None
        self.length: int | None = None  # Content-Length, once the head is read
        self.chunk_at: int | None = None  # chunked: where the next chunk-size line starts
        self.chunked_bytes = 0  # chunked: body bytes (without framing) before chunk_at
        self.send_continue = False  # Expect: 100-continue, and the body has not arrived yet
        self._searched = 0

    def feed(self, data: bytes, now: float | None = None):
        self.buf += data
        if self.head_end is None:
            refusal = self._find_head(time.monotonic() if now is None else now)
            if refusal is not None or self.head_end is None:
                return refusal
        if self.chunk_at is not None:
            return self._chunks()
        if self.length is not None and len(self.buf) < self.head_end + self.length:
            return None
        return self.READY

    def timed_out(self) -> tuple[int, str]:
        if self.head_end is None:
            return 408, refused(
                "request",
                f"the request line and headers did not arrive within {self.header_timeout:g} s",
                f"a whole request head within {self.header_timeout:g} s of connecting",
            )
        return 408, refused(
            "body",
            f"{len(self.buf) - self.head_end:,} bytes arrived in {self.body_timeout:g} s",
            f"the whole body within {self.body_timeout:g} s of the headers",
        )

    def _find_head(self, now: float):
        """Only the bytes new since the last call are searched: a client trickling its head byte by byte must
        not cost quadratic time."""
        start = 2 if self.buf[:2] == b"\r\n" else 0  # one empty line before a request is allowed (RFC 9112 2.2)
        searched, self._searched = max(start, self._searched - 3), len(self.buf)
        end = self.buf.find(b"\r\n\r\n", searched)
        if BARE_LF.search(self.buf, searched, end + 2 if end >= 0 else len(self.buf)):
            # gunicorn refuses a bare LF at once; waiting here for a CRLF CRLF that never comes would hang
            return 400, refused("request", "a line ends with a bare LF", "lines that end with CRLF (RFC 9112)")
        if (len(self.buf) if end < 0 else end + 4) - start > MAX_HEAD_BYTES:
            return 431, refused(
                "request",
                f"headers over {MAX_HEAD_BYTES:,} bytes",
                f"a request line and headers of up to {MAX_HEAD_BYTES:,} bytes",
            )
        if end < 0:
            return None
        self.head_end = end + 4
        self.deadline = now + self.body_timeout
        return self._framing(bytes(self.buf[start:end]).split(b"\r\n"))

    def _framing(self, lines: list[bytes]):
        fields: dict[bytes, list[bytes]] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if colon:
                fields.setdefault(name.strip().lower(), []).append(value.strip(b" \t"))
        lengths, codings = fields.get(b"content-length", []), fields.get(b"transfer-encoding", [])
        if codings:
            names = [c.strip(b" \t").lower() for c in b",".join(codings).split(b",")]
            unknown = [n for n in names if n not in TRANSFER_CODINGS]
            if unknown:  # gunicorn would answer 501: this is the client's error, and a 4xx says so
                return 400, not_allowed(
                    "Transfer-Encoding", unknown[0].decode("latin-1")[:40], "chunked", problem="is not supported"
                )
            if names[-1] == b"chunked" and names.count(b"chunked") == 1 and not lengths:
                self.chunk_at = self.head_end
        elif len(lengths) == 1 and lengths[0].isdigit():  # anything else: no body, or gunicorn's 400
            digits = lengths[0].lstrip(b"0") or b"0"
            if len(digits) > len(str(MAX_BODY_BYTES)) or int(digits) > MAX_BODY_BYTES:
                return 413, str(body_too_large(digits.decode()))
            self.length = int(digits)
        body_to_come = (self.chunk_at is not None or bool(self.length)) and len(self.buf) == self.head_end
        expects = b"100-continue" in [v.lower() for v in fields.get(b"expect", [])]
        self.send_continue = body_to_come and expects and lines[0].endswith(b"HTTP/1.1")
        return None

    def _chunks(self):
        """Walk the chunks received so far; chunk_at only moves past a chunk that arrived whole."""
        while True:
            line_end = self.buf.find(b"\r\n", self.chunk_at)
            if line_end < 0:
                return (
                    (400, refused("body", f"a chunk-size line over {MAX_CHUNK_LINE} bytes", "a hexadecimal size"))
                    if len(self.buf) - self.chunk_at > MAX_CHUNK_LINE
                    else None
                )
            size_text, *extension = bytes(self.buf[self.chunk_at : line_end]).split(b";", 1)
            if extension:
                size_text = size_text.rstrip(b" \t")  # whitespace only before an extension, as gunicorn reads it
            if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                return 400, refused(
                    "body",
                    f"chunk size {size_text[:20].decode('latin-1')!r} is not hexadecimal",
                    "a chunked body (RFC 9112 section 7.1)",
                )
            size = int(size_text, 16)  # at most MAX_CHUNK_LINE hex digits: linear to convert
            if self.chunked_bytes + size > MAX_BODY_BYTES or line_end - self.head_end > MAX_CHUNKED_BYTES:
                return 413, str(body_too_large(self.chunked_bytes + size))
            if size == 0:
                return self._trailers(line_end + 2)
            data_end = line_end + 2 + size
            if len(self.buf) < data_end + 2:
                return None
            if self.buf[data_end : data_end + 2] != b"\r\n":
                return 400, refused("body", "a chunk is longer than its size says", "a chunked body (RFC 9112 7.1)")
            self.chunked_bytes += size
            self.chunk_at = data_end + 2

    def _trailers(self, start: int):
        if self.buf[start : start + 2] == b"\r\n" or self.buf.find(b"\r\n\r\n", start) >= 0:
            return self.READY
        if len(self.buf) - start > MAX_HEAD_BYTES:
            return 431, refused("body", f"trailer fields over {MAX_HEAD_BYTES:,} bytes", f"up to {MAX_HEAD_BYTES:,}")
        return None


class LogThrottle:
    """One kind of log line at most ``burst`` times per ``window_s`` seconds; the rest are counted, and the count
    is logged once the window is over (:meth:`flush` runs at every turn of the event loop), so a flood of bad
    clients costs a few lines, not one per event."""

    def __init__(self, log, window_s: float, burst: int, summary: str):
        self.log, self.window_s, self.burst = log, window_s, burst
        self.summary = summary  # formatted with (lines not logged, window_s)
        self.window_end: float | None = None
        self.logged = self.skipped = 0

    def __call__(self, now: float, message: str, *args) -> None:
        self.flush(now)
        if self.window_end is None:
            self.window_end = now + self.window_s
        if self.logged < self.burst:
            self.logged += 1
            self.log(message, *args)
        else:
            self.skipped += 1

    def flush(self, now: float) -> None:
        if self.window_end is not None and now >= self.window_end:
            if self.skipped:
                self.log(self.summary, self.skipped, self.window_s)
            self.window_end, self.logged, self.skipped = None, 0, 0


def connection_limit(wanted: int, open_files_limit: int, open_now: int) -> int:
    """Connections one worker may hold at once: ``wanted``, or fewer when the open-file limit leaves less room
    (each connection is a descriptor) beside the ``open_now`` the worker already holds."""
    if open_files_limit == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, open_files_limit - open_now - DESCRIPTOR_SPARE))


def open_descriptors() -> int:
    """Files this process holds open (Linux and macOS list them in /dev/fd)."""
    try:
        return len(os.listdir("/dev/fd"))
    except OSError:
        return 0


class _Conn(TConn):
    """A connection whose reads in a pool thread are bounded; a graceful close is handed to the worker's
    event loop instead of blocking it (gunicorn lingers up to 2 s per closed connection, in its event loop)."""

    whole = False  # a complete request is buffered in the parser
    linger = None  # the worker's non-blocking graceful close

    def init(self):
        super().init()
        self.sock.settimeout(THREAD_IO_TIMEOUT_S)

    def close(self, graceful=False):
        if graceful and self.linger is not None:
            self.linger(self.sock)
        else:
            super().close(graceful)


class WholeRequestWorker(ThreadWorker):
    """gunicorn's gthread worker, except that a pool thread only ever gets a request that has fully arrived."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.cfg.is_ssl or "h2" in (getattr(self.cfg, "http_protocols", None) or []):
            raise RuntimeError("WholeRequestWorker reads plain HTTP/1.1 only (no TLS, no HTTP/2)")
        options = ServingOptions.from_environment()  # what serve() started this server with
        self.header_timeout, self.body_timeout = options.header_timeout, options.body_timeout
        self.reading: dict[_Conn, RequestScan] = {}
        self.lingering: dict[socket.socket, list] = {}  # socket -> [deadline, bytes drained], oldest first
        self.max_lingering = max(1, self.worker_connections // LINGER_SHARE)
        self.accept_paused_until = 0.0
        self.refusals_log = LogThrottle(
            self.log.info,
            LOG_WINDOW_S,
            REFUSALS_LOGGED,
            "%d more requests refused before they reached the application in %g s",
        )
        self.accept_log = LogThrottle(
            self.log.warning, LOG_WINDOW_S, 1, "cannot accept a connection (out of descriptors) %d more times in %g s"
        )

    def run(self):
        """Serve, with no more connections than the open-file limit has room for: measured now, when the
        application (the model) is loaded and holds what it needs."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        open_now = open_descriptors()
        limit = connection_limit(self.cfg.worker_connections, soft, open_now)
        if limit < self.cfg.worker_connections:
            self.log.warning(
                "at most %d connections at once, not %d: the open-file limit is %d and %d files are "
                "open (raise it with `ulimit -n`)",
                limit,
                self.cfg.worker_connections,
                soft,
                open_now,
            )
        self.worker_connections = limit
        self.max_keepalived = limit - self.cfg.threads
        self.max_lingering = max(1, limit // LINGER_SHARE)
        super().run()

    def set_accept_enabled(self, enabled):
        if enabled and time.monotonic() < self.accept_paused_until:
            return  # out of descriptors a moment ago: trying again at once would spin (the event loop asks again)
        super().set_accept_enabled(enabled)

    def accept(self, listener):
        try:
            sock, address = listener.accept()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE):  # out of descriptors: wait for one to close, do not crash
                self.accept_log(
                    time.monotonic(), "cannot accept a connection: %s (%d connections open)", e, self.nr_conns
                )
                self.set_accept_enabled(False)
                self.accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
            elif e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = _Conn(self.cfg, sock, address, listener.getsockname())  # non-blocking from here
        conn.linger = self._linger
        self._read(conn)

    def enqueue_req(self, conn):
        """Every path to the thread pool comes here (a new connection, a kept-alive one that turned readable, a
        read-ahead next request): only a whole request goes on to a thread."""
        if conn.whole:
            conn.whole = False
            super().enqueue_req(conn)
        else:
            self._read(conn)

    def _read(self, conn: _Conn) -> None:
        scan = RequestScan(time.monotonic(), self.header_timeout, self.body_timeout)
        held = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        conn.sock.setblocking(False)
        self.reading[conn] = scan
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._on_readable, conn))
        if held:
            self._advance(conn, scan.feed(held))

    def _on_readable(self, conn: _Conn, _sock) -> None:
        try:
            data = conn.sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # closed before the request was whole: nobody to answer
            self._stop_reading(conn)
            self.nr_conns -= 1
            util.close(conn.sock)
            return
        self._advance(conn, self.reading[conn].feed(data))

    def _advance(self, conn: _Conn, outcome) -> None:
        scan = self.reading[conn]
        if scan.send_continue:  # the client waits for this before it sends the body
            scan.send_continue = False
            self._send(conn.sock, CONTINUE)
        if outcome is None:
            return
        self._stop_reading(conn)
        if outcome == RequestScan.READY:
            if conn.parser is None:
                conn.parser = gunicorn_http.get_parser(self.cfg, conn.sock, conn.client)
            conn.parser.unreader.unread(bytes(scan.buf))
            conn.data_ready = conn.whole = True
            self.enqueue_req(conn)
        else:
            status, message = outcome
            self._refuse(conn, status, message, head=bytes(scan.buf[:MAX_HEAD_BYTES]))

    def _stop_reading(self, conn: _Conn) -> None:
        del self.reading[conn]
        self.poller.unregister(conn.sock)

    def _refuse(self, conn: _Conn, status: int, message: str, head: bytes = b"") -> None:
        """Answer a request that never reaches the application, then close. ``head``: what arrived of the request,
        whose target picks the error's shape (OpenAI's under /v1)."""
        target = head.split(b"\r\n", 1)[0].split(b" ")[1:2]
        body = json.dumps(error_body(target[0] if target else b"", message, status)).encode()
        self.refusals_log(time.monotonic(), "%s: %s %s", conn.client, status, message)
        self._send(
            conn.sock,
            (
                f"HTTP/1.1 {status} {http_status.HTTPStatus(status).phrase}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            ).encode()
            + body,
        )
        self.nr_conns -= 1  # the connection ends here; its socket counts again while it lingers
        self._linger(conn.sock)

    @staticmethod
    def _send(sock: socket.socket, data: bytes) -> None:
        """Best effort, never blocking: a few hundred bytes fit an idle socket's send buffer."""
        try:
            sock.send(data)
        except OSError:
            pass

    def _linger(self, sock: socket.socket) -> None:
        """Close gracefully (RFC 9112 9.6), as util.close_graceful does but without blocking: stop writing, then
        read and drop what the client still sends until it closes, LINGER_S passes or LINGER_MAX_BYTES came.
        A lingering socket holds a descriptor, so it counts as a connection; when max_lingering already linger,
        the oldest closes at once (it has had the most time)."""
        try:
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            util.close(sock)
            return
        if len(self.lingering) >= self.max_lingering:
            self._end_linger(next(iter(self.lingering)))
        self.nr_conns += 1
        self.lingering[sock] = [time.monotonic() + LINGER_S, 0]
        self.poller.register(sock, selectors.EVENT_READ, self._drain)

    def _drain(self, sock: socket.socket) -> None:
        if sock not in self.lingering:  # closed earlier in this turn of the event loop, to make room
            return
        try:
            data = sock.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        self.lingering[sock][1] += len(data)
        if not data or self.lingering[sock][1] > LINGER_MAX_BYTES:
            self._end_linger(sock)

    def _end_linger(self, sock: socket.socket) -> None:
        del self.lingering[sock]
        self.poller.unregister(sock)
        util.close(sock)
        self.nr_conns -= 1

    def murder_pending(self):
        """Called by the event loop at least once a second: refuse requests past their time, end lingering."""
        super().murder_pending()
        now = time.monotonic()
        for conn, scan in list(self.reading.items()):
            if not self.alive:  # stopping: a request not yet whole is not started
                self._stop_reading(conn)
                self.nr_conns -= 1
                util.close(conn.sock)
            elif now >= scan.deadline:
                self._stop_reading(conn)
                status, message = scan.timed_out()
                self._refuse(conn, status, message, head=bytes(scan.buf[:MAX_HEAD_BYTES]))
        for sock, (deadline, _) in list(self.lingering.items()):
            if now >= deadline or not self.alive:
                self._end_linger(sock)
        self.refusals_log.flush(now)
        self.accept_log.flush(now)


def enough_descriptors(needed: int = WORKER_CONNECTIONS + 100) -> None:
    """Raise the soft limit on open files (often 1,024) so that gunicorn reaches its own connection limit before
    the system's: a worker that runs out of descriptors cannot accept, and every open connection holds one.
    Where the hard limit is lower, the worker takes fewer connections (WholeRequestWorker.run)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else min(needed, hard), hard)
        )
