"""Free TCP ports on the loopback interface (for rendezvous, TensorBoard, endpoints)."""

from __future__ import annotations

import errno
import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_pair() -> int:
    """A free port whose next one is free too (a multi-node job's store and its ranks' rendezvous)."""
    while port_in_use("127.0.0.1", (port := free_port()) + 1):
        pass
    return port


def port_in_use(host: str, port: int) -> bool:
    """True if a server could not bind ``host:port`` now (another one listens there). Checked with SO_REUSEADDR,
    as the servers bind, so a port whose last connections are still closing counts as free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def busy_port_message(flag: str, port: int) -> str:
    return f"{flag}: port {port} is in use; omit {flag} for a free one"
