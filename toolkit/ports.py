"""Free TCP ports on the loopback interface (for rendezvous, TensorBoard, endpoints)."""

from __future__ import annotations

import errno
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 1024  # below: privileged ports


def _ephemeral_low() -> int:
    """The lowest port the kernel gives an outgoing connection as its own (Linux's default: 32768)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port no server listens on now, for a server that binds it a little later (torch's TCPStore in a rank,
    TensorBoard, an endpoint). Chosen at random below the kernel's ephemeral range: the kernel's own free port (bind
    to 0) is one it may give an outgoing connection meanwhile as that connection's local port, and the server's
    bind then fails with EADDRINUSE."""
    low = _ephemeral_low()
    chooser = random.SystemRandom()
    for _ in range(1000):
        port = chooser.randrange(LOWEST, low - 1)  # low - 1: room for free_port_pair's second port
        if not port_in_use("127.0.0.1", port):
            return port
    with socket.socket() as s:  # all taken: whatever the kernel has
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
