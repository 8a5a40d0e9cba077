"""The debug section's refusals (port range, loopback only, a taken port), and what the CLI and the panel say while
rank 0 waits for a debugger."""

from __future__ import annotations

import json
import socket

import pytest

from toolkit import config as config_mod
from toolkit.config import ConfigError
from toolkit.runs import debugging
from toolkit.events import DebuggerEvent
from toolkit.runs.progress import RunProgress
from toolkit.rundir import RunDir


@pytest.mark.parametrize("port", [70000, -1])
def test_a_debug_port_out_of_range_is_refused_naming_the_field(port):
    with pytest.raises(ConfigError, match=rf"debug\.port: {port} is out of range; allowed: >= 0 and <= 65535"):
        config_mod.load("tiny", ["debug.enabled=true", f"debug.port={port}"])


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.2", "localhost", "::1", ""])
def test_a_debug_host_other_than_ipv4_loopback_is_refused_saying_why_and_how_to_reach_it(host):
    with pytest.raises(ConfigError) as refused:
        config_mod.load("tiny", ["debug.enabled=true", f"debug.host={json.dumps(host)}"])
    message = str(refused.value)
    assert message.startswith(f"debug.host: {host!r} is not loopback") and "no key" in message
    assert "allowed: an IPv4 loopback address such as '127.0.0.1'" in message and "ssh -L" in message


def test_the_default_listens_on_127_0_0_1_at_a_free_port_and_another_loopback_address_is_allowed():
    default = config_mod.load("tiny", ["debug.enabled=true"]).debug
    assert (default.host, default.port, default.wait_for_client) == ("127.0.0.1", 0, True)
    assert config_mod.load("tiny", ["debug.host=127.0.0.2"]).debug.host == "127.0.0.2"


def test_a_taken_debug_port_is_refused_naming_it_before_anything_listens_or_is_reported(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = RunDir.create(tmp_path / "run", config_mod.load("tiny", ["debug.enabled=true", f"debug.port={port}"]))
        with pytest.raises(debugging.DebuggerError, match=rf"debug\.port: {port} is in use on 127\.0\.0\.1"):
            debugging.wait_for_debugger(run)
    assert "debugger" not in run.read_status() and run.events() == []


def test_without_debug_enabled_or_in_another_rank_nothing_listens(tmp_path, monkeypatch):
    plain = RunDir.create(tmp_path / "plain", config_mod.load("tiny"))
    assert debugging.wait_for_debugger(plain) is None
    monkeypatch.setenv("RANK", "1")
    debug = RunDir.create(tmp_path / "debug", config_mod.load("tiny", ["debug.enabled=true"]))
    assert debugging.wait_for_debugger(debug) is None
    assert debug.events() == [] and "debugger" not in debug.read_status()


def test_while_it_waits_the_cli_prints_where_to_attach_and_a_launch_json_vs_code_reads():
    waiting = DebuggerEvent(state="waiting", host="127.0.0.1", port=5678, world_size=2, attempt=0)
    text = debugging.instructions(waiting)
    first, _, rest = text.partition("\n")
    assert first.startswith("waiting for a debugger on 127.0.0.1:5678 (rank 0")
    assert "the other 1 rank(s) wait for it in their first collective" in first
    (entry,) = json.loads(rest[rest.index("{"):])["configurations"]
    assert entry == {"name": "Attach to trainbook", "type": "debugpy", "request": "attach",
                     "connect": {"host": "127.0.0.1", "port": 5678}, "justMyCode": False}
    attached = DebuggerEvent(state="attached", host="127.0.0.1", port=5678, world_size=1)
    assert debugging.instructions(attached) == "debugger attached on 127.0.0.1:5678: training starts"


def test_the_panel_says_the_run_waits_for_a_debugger_until_one_attaches():
    progress = RunProgress(max_steps=10)
    progress.apply(DebuggerEvent(state="waiting", host="127.0.0.1", port=5678, world_size=1, attempt=0))
    assert progress.message.startswith("waiting for a debugger on 127.0.0.1:5678")
    progress.apply(DebuggerEvent(state="attached", host="127.0.0.1", port=5678, world_size=1, attempt=0))
    assert progress.message == ""
