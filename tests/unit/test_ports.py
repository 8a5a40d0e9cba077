"""Free ports: handed to a server that binds them later, so they must not be ones the kernel gives outgoing
connections meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

from toolkit.ports import free_port, free_port_pair, port_in_use


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_a_free_port_is_below_the_ephemeral_range_and_bindable():
    ports = {free_port() for _ in range(50)}
    assert all(1024 <= p < ephemeral_low() for p in ports), sorted(ports)
    assert len(ports) > 1, "chosen at random, so two servers asking at once rarely get the same one"
    port = ports.pop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_listening_port_is_never_chosen():
    low = ephemeral_low()
    taken = []
    try:
        for port in range(max(1024, low - 64), low):  # fill the top of the range with listeners
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            s.listen()
            taken.append(s)
        busy = {s.getsockname()[1] for s in taken}
        assert all(port_in_use("127.0.0.1", p) for p in busy)
        assert not {free_port() for _ in range(200)} & busy
    finally:
        for s in taken:
            s.close()


def test_a_pair_is_two_free_ports_in_a_row():
    port = free_port_pair()
    assert port + 1 < ephemeral_low()
    assert not port_in_use("127.0.0.1", port) and not port_in_use("127.0.0.1", port + 1)
