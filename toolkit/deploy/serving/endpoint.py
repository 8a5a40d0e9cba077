"""A local online endpoint: the exported model behind Azure ML's inference server, on 127.0.0.1, with a key.

    endpoint = serve("demo")                      # a registered model, or a model folder
    status, answer = endpoint.request({"prompt": "def "})   # (200, {"text": ..., "timing_ms": ...}) with the key
    endpoint.stop()

Like an Azure ML managed online endpoint it has a name, a scoring URL and a key (generated once per endpoint,
stored with 0600 permissions in the workspace, never printed in full). The server runs in its own process
group; ``stop()`` ends it and everything it started. It speaks plain HTTP: bound to any address but loopback,
``serve()`` warns (PlainHTTPWarning) that the key can be read on the network.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.ports import free_port
from toolkit.runs.parent_watch import parent_env
from toolkit.deploy.serving.protocol import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, REQUEST_TIMEOUT_S

SCORE_SCRIPT = Path(__file__).resolve().parent / "score.py"
READY_TIMEOUT_S = 120.0
DEFAULT_THREADS = 32  # concurrent requests one server process accepts; the batcher serialises model work


class EndpointError(RuntimeError):
    """The endpoint did not start; the message carries the end of its log."""


class PlainHTTPWarning(UserWarning):
    """The endpoint listens beyond this machine, and its key travels unencrypted."""


def plain_http_warning(host: str) -> str | None:
    """What to warn about when binding ``host``; None for loopback, which only this machine can reach."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # a host name may resolve to any interface
    if loopback:
        return None
    return (f"--host {host}: the endpoint is reachable from other machines over plain HTTP, so its key and every "
            "request and answer can be read on the network. Keep the default 127.0.0.1, or put the endpoint "
            "behind a TLS proxy on a network you trust.")


def mask_key(key: str) -> str:
    return f"{key[:4]}…{key[-2:]}" if len(key) > 8 else "…"


def endpoint_key(folder: Path) -> str:
    """The endpoint's key: created once (0600, written exclusively), then reused, like an Azure ML endpoint's."""
    path = folder / "key"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    key = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return key


@dataclass
class LocalEndpoint:
    name: str
    url: str
    key: str = field(repr=False)
    runtime: str
    model_dir: Path
    folder: Path
    process: subprocess.Popen = field(repr=False)

    @property
    def scoring_url(self) -> str:
        return f"{self.url}/score"

    @property
    def log_path(self) -> Path:
        return self.folder / "server.log"

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}

    def request(self, body: dict, headers: dict | None = None, timeout: float = 60.0) -> tuple[int, dict]:
        """POST ``body`` as JSON to the scoring URL with this endpoint's key (or exactly ``headers``, to see what a
        request without the key gets): (HTTP status, JSON answer). A refusal is an answer here, not an exception:
        its ``error`` names the field, the value and what is allowed."""
        request = urllib.request.Request(self.scoring_url, data=json.dumps(body).encode(),
                                         headers=self.headers() if headers is None else headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                return error.code, json.loads(text)
            except json.JSONDecodeError:  # not from score.py (e.g. the server's own 404 page)
                return error.code, {"error": text.strip() or error.reason}

    def describe(self) -> str:
        return (f"endpoint {self.name}: {self.scoring_url} (key {mask_key(self.key)}, {self.runtime}, "
                f"model {self.model_dir})")

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # gunicorn's master and its workers
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def __enter__(self) -> "LocalEndpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _wait_ready(endpoint: LocalEndpoint, timeout: float) -> None:
    """Until GET /score answers (the model is loaded), or the server exits, or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if endpoint.process.poll() is not None:
            raise EndpointError(f"the server exited with code {endpoint.process.returncode} before it was ready:\n"
                                + _log_tail(endpoint.log_path))
        try:
            with urllib.request.urlopen(endpoint.scoring_url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)  # nothing to wait on but the socket: the server is another process tree
    endpoint.stop()
    raise EndpointError(f"the server was not ready within {timeout:.0f} s:\n" + _log_tail(endpoint.log_path))


def _log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def serve(model: str | Path, port: int | None = None, runtime: str = "onnx", host: str = "127.0.0.1",
          max_batch: int = 16, max_wait_ms: float = 5.0, threads: int = DEFAULT_THREADS, name: str | None = None,
          workspace: str | Path | None = None, ready_timeout: float = READY_TIMEOUT_S,
          header_timeout: float = HEADER_TIMEOUT_S, body_timeout: float = BODY_TIMEOUT_S,
          request_timeout: float = REQUEST_TIMEOUT_S) -> LocalEndpoint:
    """Start a local endpoint for ``model`` (a model folder or a registered NAME[:VERSION]) and wait until it
    answers; returns its handle. A client gets 408 if its request head has not arrived ``header_timeout``
    seconds after it connected, or its body ``body_timeout`` seconds after the head; 503 if its answer is not
    ready ``request_timeout`` seconds after the request came (the model is busy with others)."""
    import yaml

    from toolkit.catalogue.data_assets import NAME_RE
    from toolkit.deploy.model_format import verify_model_folder
    from toolkit.catalogue.model_registry import resolve_model_dir
    from toolkit.deploy.serving.runtimes import RUNTIMES
    from toolkit.catalogue.workspace import Workspace

    if runtime not in RUNTIMES:
        raise ValueError(f"--runtime: {runtime!r} is not allowed; allowed: {', '.join(RUNTIMES)}")
    if port is not None and not 1024 <= port <= 65535:
        raise ValueError(f"--port: {port} is not allowed; allowed: 1024 to 65535")
    if not 1 <= max_batch <= 256:
        raise ValueError(f"--max-batch: {max_batch} is not allowed; allowed: 1 to 256")
    if not 0 <= max_wait_ms <= 1000:
        raise ValueError(f"--max-wait-ms: {max_wait_ms} is not allowed; allowed: 0 to 1000")
    for option, seconds in (("header_timeout", header_timeout), ("body_timeout", body_timeout),
                            ("request_timeout", request_timeout)):
        if not 0.5 <= seconds <= 3600:
            raise ValueError(f"{option}: {seconds} is not allowed; allowed: 0.5 to 3600 seconds")
    if warning := plain_http_warning(host):
        warnings.warn(warning, PlainHTTPWarning, stacklevel=2)
    model_dir = resolve_model_dir(model, workspace).resolve()
    verify_model_folder(model_dir)  # a tampered file is named here, not lost in the server's log
    name = name or yaml.safe_load((model_dir / "config.yaml").read_text())["name"]  # the run's config name
    if not NAME_RE.fullmatch(str(name)):  # it names a folder in the workspace: no '/', no '..'
        raise ValueError(f"name: {name!r} is not allowed; allowed: letters, digits, '_', '-', '.', starting with a "
                         "letter or digit")
    folder = Workspace.open(workspace).root / "endpoints" / name
    key = endpoint_key(folder)
    port = port or free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRAINBOOK_RUNTIME": runtime, "TRAINBOOK_MAX_BATCH": str(max_batch),
           "TRAINBOOK_MAX_WAIT_MS": str(max_wait_ms), "TRAINBOOK_KEY_FILE": str(folder / "key"), "WORKER_COUNT": "1",
           # one process, many request threads, so concurrent requests can share a batch (server_main adds the
           # worker class that gives threads only whole requests, and turns gunicorn's control socket off)
           "GUNICORN_CMD_ARGS": f"--threads {threads}",
           "TRAINBOOK_HEADER_TIMEOUT_S": str(header_timeout), "TRAINBOOK_BODY_TIMEOUT_S": str(body_timeout),
           "TRAINBOOK_REQUEST_TIMEOUT_S": str(request_timeout),
           **parent_env()}  # the server stops if this process dies without stop()
    cmd = [sys.executable, "-m", "toolkit.deploy.serving.server_main", "--host", host, "--entry_script", str(SCORE_SCRIPT),
           "--model_dir", str(model_dir), "--port", str(port)]
    with open(folder / "server.log", "wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    endpoint = LocalEndpoint(name, f"http://{host}:{port}", key, runtime, model_dir, folder, process)
    _wait_ready(endpoint, ready_timeout)
    return endpoint
