"""`train --debug`: rank 0 listens for a debugger on loopback only and holds training until one attaches (a real
Debug Adapter Protocol client here), again after a crash; a stop while it waits ends every process of the run."""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from toolkit.runs import launch
from toolkit.runs.processes import TOKEN_ENV
from toolkit.rundir import RunDir
from toolkit.status import FINAL_STATES

from conftest import PROJECT, no_runaway_training

pytestmark = pytest.mark.slow

DEADLINE_S = 180.0


class DapClient:
    """The least a debugger does to attach, as VS Code does it: the Debug Adapter Protocol over TCP (messages framed
    by a Content-Length header), initialize, attach, then configurationDone once its breakpoints would be set."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.settimeout(None)
        self.seq = 0
        self.inbox: queue.Queue = queue.Queue()  # every message as it arrives; None once the connection is closed
        self.passed_over: list[dict] = []
        # reads all the time, so the debuggee never blocks on a full socket while it trains
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stream = self.sock.makefile("rb")
        try:
            while True:
                length = None
                while (line := stream.readline()) not in (b"\r\n", b"\n"):
                    if not line:
                        return
                    key, _, value = line.partition(b":")
                    if key.strip().lower() == b"content-length":
                        length = int(value)
                self.inbox.put(json.loads(stream.read(length)))
        except OSError:
            return
        finally:
            self.inbox.put(None)

    def request(self, command: str, **arguments) -> None:
        self.seq += 1
        body = json.dumps({"seq": self.seq, "type": "request", "command": command, "arguments": arguments}).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def await_message(self, kind: str, name: str) -> dict:
        """The response to command ``name`` or the event ``name`` (``kind``), whichever order messages come in."""
        key = "command" if kind == "response" else "event"
        for message in self.passed_over:
            if message["type"] == kind and message.get(key) == name:
                self.passed_over.remove(message)
                return message
        while True:
            message = self.inbox.get(timeout=DEADLINE_S)
            assert message is not None, f"the connection closed before the {name} {kind}"
            if message["type"] == kind and message.get(key) == name:
                return message
            self.passed_over.append(message)

    def attach(self) -> None:
        self.request("initialize", clientID="trainbook-test", adapterID="debugpy", pathFormat="path",
                     linesStartAt1=True, columnsStartAt1=True)
        assert self.await_message("response", "initialize")["success"]
        self.request("attach", name="trainbook-test", justMyCode=True)
        self.await_message("event", "initialized")
        self.request("configurationDone")
        assert self.await_message("response", "configurationDone")["success"]
        assert self.await_message("response", "attach")["success"]

    def await_closed(self) -> None:
        while self.inbox.get(timeout=DEADLINE_S) is not None:
            pass

    def close(self) -> None:
        self.sock.close()


def await_debugger(run: RunDir, state: str, attempt: int) -> dict:
    """The run's debugger event of this state and attempt; another process writes it: re-read until it is there."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        found = [e for e in run.events("debugger") if e["state"] == state and e["attempt"] == attempt]
        if found:
            return found[0]
        assert run.read_status().get("state") not in FINAL_STATES, f"the run ended: {run.read_status()}"
        assert time.monotonic() < deadline, f"no debugger {state} event of attempt {attempt}"
        time.sleep(0.05)


def listeners(port: int) -> list:
    return [c for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def outside_address() -> str | None:
    """This machine's first non-loopback IPv4 address (None on a machine without one)."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


def processes_of(token: str) -> list[psutil.Process]:
    """Live processes started with the run's token: the supervisor, launcher, ranks, and anything they started."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get(TOKEN_ENV) == token:
                found.append(process)
    return found


def test_train_debug_listens_on_loopback_only_trains_once_attached_and_waits_again_after_a_crash(tmp_path):
    run = RunDir(tmp_path / "run")
    cli = subprocess.Popen(
        [sys.executable, "-m", "toolkit", "train", "tiny", "--debug", "--run-dir", str(run.path), "--max-restarts", "1",
         "--set", "train.max_steps=8", "--set", "train.log_every=2", "--set", "fault.kill_at_step=4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT)
    with no_runaway_training(run, cli):
        waiting = await_debugger(run, "waiting", attempt=0)
        port = waiting["port"]
        assert waiting["host"] == "127.0.0.1" and waiting["world_size"] == 1
        status = run.read_status()
        assert status["state"] == "queued", "nothing trains while it waits"
        assert status["debugger"] == {"state": "waiting", "host": "127.0.0.1", "port": port, "attempt": 0}

        (listener,) = listeners(port)
        assert listener.laddr.ip == "127.0.0.1"
        worker = psutil.Process(listener.pid)  # the adapter lives in rank 0 itself: nothing of it can outlive it
        assert "toolkit.runs.worker" in worker.cmdline() and worker.environ()[TOKEN_ENV] == status["run_token"]
        assert not [p for p in processes_of(status["run_token"]) if "debugpy" in " ".join(p.cmdline())]
        if outside_address():  # the machine's own address on the network does not reach it
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((outside_address(), port), timeout=10).close()
        assert run.events("train") == []

        client = DapClient(port)
        client.attach()
        await_debugger(run, "attached", attempt=0)
        client.await_closed()  # the fault SIGKILLs rank 0 at step 4: the session ends with it
        client.close()

        again = await_debugger(run, "waiting", attempt=1)  # the supervisor's restart waits again, on the same port
        assert again["port"] == port
        client = DapClient(port)
        client.attach()
        _, err = cli.communicate(timeout=DEADLINE_S)
        client.close()
    assert cli.returncode == 0, err
    assert f"waiting for a debugger on 127.0.0.1:{port}" in err
    snippet = err[err.index("{\n"):err.index("\n}\n") + 2]  # the launch.json VS Code takes, as printed
    (entry,) = json.loads(snippet)["configurations"]
    assert entry["request"] == "attach" and entry["connect"] == {"host": "127.0.0.1", "port": port}
    assert run.read_status()["state"] == "completed"
    story = [(e["event"], e.get("state"), e.get("attempt")) for e in run.events() if e["event"] != "train"
             and e["event"] != "eval"]
    assert story[:3] == [("debugger", "waiting", 0), ("debugger", "attached", 0), ("status", "running", 0)]
    restart = story.index(("restart", None, 1))
    assert story[restart + 1:restart + 4] == [("debugger", "waiting", 1), ("debugger", "attached", 1),
                                              ("status", "running", 1)]
    assert listeners(port) == []


def test_stopping_a_run_whose_rank_0_waits_for_a_debugger_ends_every_process(tmp_path):
    """Two processes: only rank 0 listens, rank 1 waits for it in the rendezvous; the stop must end both at once
    (not after the process group's timeout)."""
    handle = launch.train("tiny", ["debug.enabled=true", "engine.nproc=2"], run_dir=tmp_path / "run")
    run = handle.run
    with no_runaway_training(run):
        waiting = await_debugger(run, "waiting", attempt=0)
        assert waiting["world_size"] == 2
        token = run.read_status()["run_token"]
        (listener,) = listeners(waiting["port"])
        assert psutil.Process(listener.pid).environ()["RANK"] == "0"
        assert sorted(p.environ()["RANK"] for p in processes_of(token) if "RANK" in p.environ()) == ["0", "1"]

        code = handle.stop(grace_s=60)
        assert code != -signal.SIGKILL, "the run did not end on the stop: it was killed after the grace"
        assert run.read_status()["state"] == "stopped"
        assert [e["state"] for e in run.events("status")] == ["stopped"]
        assert processes_of(token) == []
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", waiting["port"]), timeout=10).close()


def test_a_debug_host_off_loopback_is_refused_before_anything_starts(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "toolkit", "train", "tiny", "--debug", "--run-dir",
                           str(tmp_path / "run"), "--set", "debug.host=0.0.0.0"],
                          capture_output=True, text=True, cwd=PROJECT, timeout=120)
    assert proc.returncode == 2
    assert "debug.host: '0.0.0.0' is not loopback" in proc.stderr and "127.0.0.1" in proc.stderr
    assert not (tmp_path / "run").exists()
