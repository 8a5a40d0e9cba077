"""Start a real TensorBoard for a run (scalars from tb/, traces from profile/) on 127.0.0.1, and stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from toolkit.runs.parent_watch import parent_env
from toolkit.ports import free_port

READY_TIMEOUT_S = 90.0


class TensorBoardError(RuntimeError):
    pass


@dataclass
class TensorBoardServer:
    url: str
    logdir: Path
    process: subprocess.Popen

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_tensorboard(run_dir: str | Path, port: int | None = None) -> TensorBoardServer:
    """Serve ``run_dir`` (its tb/ scalars and profile/ traces) and return once TensorBoard answers HTTP."""
    logdir = Path(run_dir)
    if not logdir.is_dir():
        raise TensorBoardError(f"run_dir: {str(logdir)!r} is not a folder; allowed: a run directory")
    port = port or free_port()
    log = open(logdir / "tensorboard.log", "ab")
    process = subprocess.Popen(
        [sys.executable, "-m", "toolkit.runs.tensorboard_main", "--logdir", str(logdir), "--host", "127.0.0.1",
         "--port", str(port), "--reload_interval", "5"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        env={**os.environ, **parent_env()})  # stops by itself if this process dies without stop()
    log.close()
    server = TensorBoardServer(url=f"http://127.0.0.1:{port}/", logdir=logdir, process=process)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(server.url + "data/logdir", timeout=2) as response:
                if response.status == 200:
                    return server
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        try:
            code = process.wait(0.25)  # returns at once if TensorBoard died (port taken, bad install)
        except subprocess.TimeoutExpired:
            continue
        raise TensorBoardError(f"TensorBoard exited with code {code}; see {logdir / 'tensorboard.log'}")
    server.stop()
    raise TensorBoardError(f"TensorBoard did not answer on {server.url} within {READY_TIMEOUT_S:.0f} s")
