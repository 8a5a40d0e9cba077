"""A service process (TensorBoard, the local endpoint): started in a session of its own with its output in a log
file, watched until it answers HTTP, stopped with SIGTERM and, if it lingers, SIGKILL. It also stops by itself
when the process that started it dies without stopping it (toolkit.parent_watch)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from toolkit.fsio import open_log
from toolkit.paths import SAFE_PATH_ENV
from toolkit.parent_watch import parent_env

STOP_GRACE_S = 10.0  # SIGTERM, then this long to exit, then SIGKILL
POLL_S = 0.1  # between two readiness requests; the wait ends early when the process exits


class ServiceError(RuntimeError):
    """A service did not start; the message carries the end of its log."""


@dataclass
class ServiceProcess:
    process: subprocess.Popen
    log_path: Path

    def stop(self, timeout: float = STOP_GRACE_S) -> None:
        """Stop the service's whole process group (a server's workers included); nothing if it has ended."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_service(
    cmd: list[str], log_path: Path, env: dict[str, str] | None = None, fresh_log: bool = False
) -> ServiceProcess:
    """Start ``cmd`` with its output appended to ``log_path`` (or replacing it: ``fresh_log``); ``env`` is added
    to this process's environment."""
    with open_log(Path(log_path), fresh=fresh_log) as log:
        process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **SAFE_PATH_ENV, **(env or {}), **parent_env()},
        )
    return ServiceProcess(process, Path(log_path))


def wait_until_answers(
    service: ServiceProcess, url: str, timeout: float, what: str, error: type[Exception] = ServiceError
) -> None:
    """Until GET ``url`` answers 200, or the service exits, or ``timeout`` seconds pass (it is then stopped);
    the error names ``what`` and carries the end of the log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        try:  # the socket cannot be waited on across processes; the exit can, and ends the wait at once
            code = service.process.wait(POLL_S)
        except subprocess.TimeoutExpired:
            continue
        raise error(f"{what} exited with code {code} before it answered ({service.log_path}):\n{service.log_tail()}")
    service.stop()
    raise error(f"{what} did not answer on {url} within {timeout:.0f} s ({service.log_path}):\n{service.log_tail()}")
