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

import dataclasses
import ipaddress
import json
import sys
import time
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from toolkit import key_files
from toolkit.errors import RefusedValue, UserError, not_allowed
from toolkit.key_files import KeyFile
from toolkit.names import check_name
from toolkit.ports import busy_port_message, free_port, port_in_use
from toolkit.runs.service import ServiceProcess, start_service, wait_until_answers
from toolkit.deploy.serving import running
from toolkit.deploy.serving.options import KEY_FILE_ENV, ServingOptions, check_runtime, served_tasks
from toolkit.deploy.serving.protocol import TEXT_TASKS

SCORE_SCRIPT = Path(__file__).resolve().parent / "score.py"
READY_TIMEOUT_S = 120.0


class EndpointError(UserError, RuntimeError):
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
    return (
        f"--host {host}: the endpoint is reachable from other machines over plain HTTP, so its key and every "
        "request and answer can be read on the network. Keep the default 127.0.0.1, or put the endpoint "
        "behind a TLS proxy on a network you trust."
    )


def _run_name(model_dir: Path) -> str:
    """The name of the run an export came from (its config.yaml's), which names the endpoint by default."""
    import yaml

    from toolkit.fsio import read_regular_file
    from toolkit.plain_data import RESOLVED_CONFIG_MAX_BYTES

    text = read_regular_file(
        model_dir / "config.yaml", field="config.yaml", error=EndpointError, limit=RESOLVED_CONFIG_MAX_BYTES
    )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        raise EndpointError(
            not_allowed(
                "config.yaml", str(model_dir / "config.yaml"), "a run config with a name", problem="names no run"
            )
        )
    return name


def mask_key(key: str) -> str:
    return f"{key[:4]}…{key[-2:]}" if len(key) > 8 else "…"


def endpoint_key(folder: Path) -> KeyFile:
    """The endpoint's key file: made once (written whole, mode 0600), then reused, like an Azure ML endpoint's; one
    that is empty, truncated or readable by others is replaced with a new key (its ``note`` says why)."""
    return key_files.ensure(folder / "key", "the endpoint key")


@dataclass
class LocalEndpoint:
    name: str
    url: str
    key: str = field(repr=False)
    runtime: str
    model_dir: Path
    folder: Path
    service: ServiceProcess = field(repr=False)
    tasks: tuple[str, ...] = TEXT_TASKS  # what it answers (toolkit.deploy.serving.options.served_tasks)
    key_file: KeyFile | None = field(default=None, repr=False)  # where the key is, its mode, what serve did to it

    @property
    def process(self):
        return self.service.process

    @property
    def scoring_url(self) -> str:
        return f"{self.url}/score"

    @property
    def openai_url(self) -> str:
        """OpenAI's API of a model that generates: ``openai.OpenAI(base_url=ep.openai_url, api_key=ep.key)``."""
        return f"{self.url}/v1"

    @property
    def log_path(self) -> Path:
        return self.folder / "server.log"

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}

    def request(self, body: dict, headers: dict | None = None, timeout: float = 60.0) -> tuple[int, dict]:
        """POST ``body`` as JSON to the scoring URL with this endpoint's key (or exactly ``headers``, to see what a
        request without the key gets): (HTTP status, JSON answer). A refusal is an answer here, not an exception:
        its ``error`` names the field, the value and what is allowed."""
        request = urllib.request.Request(
            self.scoring_url, data=json.dumps(body).encode(), headers=self.headers() if headers is None else headers
        )
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
        return (
            f"endpoint {self.name}: {self.scoring_url} (key {mask_key(self.key)}, {self.runtime}, "
            f"model {self.model_dir})"
        )

    def stop(self) -> None:
        self.service.stop()  # gunicorn's master and its workers

    def __enter__(self) -> LocalEndpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(
    model: str | Path,
    port: int | None = None,
    runtime: str | None = None,
    host: str = "127.0.0.1",
    name: str | None = None,
    workspace: str | Path | None = None,
    ready_timeout: float = READY_TIMEOUT_S,
    **options,
) -> LocalEndpoint:
    """Start a local endpoint for ``model`` (a model folder or a registered NAME[:VERSION]) and wait until it
    answers; returns its handle. ``runtime`` None: the folder's default (torch for a transformers model, which
    generates with a KV cache; onnx for the built-ins). ``options`` are ServingOptions' fields (max_batch,
    max_wait_ms, threads and the timeouts), checked before anything starts. A client gets 408 if its request head has
    not arrived ``header_timeout``
    seconds after it connected, or its body ``body_timeout`` seconds after the head; 503 if its answer is not
    ready ``request_timeout`` seconds after the request came (the model is busy with others)."""
    from toolkit.catalogue.model_format import verify_model_folder
    from toolkit.catalogue.model_registry import resolve_model_dir
    from toolkit.catalogue.workspace import Workspace

    if port is not None and not 1024 <= port <= 65535:
        raise RefusedValue(not_allowed("--port", port, "1024 to 65535"))
    if port is not None and port_in_use(host, port):
        raise EndpointError(busy_port_message("--port", port))
    # every bound checked here, before anything starts (the runtime's name too; which one the folder has, below)
    serving = ServingOptions(**({"runtime": runtime} if runtime is not None else {}), **options)
    if warning := plain_http_warning(host):
        warnings.warn(warning, PlainHTTPWarning, stacklevel=2)
    model_dir = resolve_model_dir(model, workspace).resolve()
    manifest = verify_model_folder(model_dir)  # a tampered file is named here, not lost in the server's log
    tasks = served_tasks(manifest)  # a model no endpoint serves is named here too
    serving = dataclasses.replace(serving, runtime=check_runtime(model_dir, manifest, runtime))
    name = name or _run_name(model_dir)
    name = check_name(str(name))  # it names a folder in the workspace: no '/', no '..'
    ws = Workspace.open(workspace)
    ws.require_writable()  # the endpoint's folder, key and log are written there
    folder = running.endpoint_folder(ws.root, name, EndpointError)
    with running.starting(folder, EndpointError):  # one server per endpoint name
        key_file = endpoint_key(folder)
        key = key_file.key
        port = port or free_port()
        # one process, many request threads, so concurrent requests can share a batch (server_main adds the worker
        # class that gives threads only whole requests, and turns gunicorn's control socket off)
        env = {"PYTHONUNBUFFERED": "1", **serving.environment(), KEY_FILE_ENV: str(folder / "key")}
        cmd = [
            sys.executable,
            "-m",
            "toolkit.deploy.serving.server_main",
            "--host",
            host,
            "--entry_script",
            str(SCORE_SCRIPT),
            "--model_dir",
            str(model_dir),
            "--port",
            str(port),
        ]
        service = start_service(cmd, folder / "server.log", env, fresh_log=True)
        endpoint = LocalEndpoint(
            name, f"http://{host}:{port}", key, serving.runtime, model_dir, folder, service, tasks, key_file=key_file
        )
        # GET /score answers once the model is loaded
        wait_until_answers(service, endpoint.scoring_url, ready_timeout, "the server", EndpointError)
        running.record(
            folder,
            running.RunningEndpoint(
                name=name,
                url=endpoint.url,
                pid=service.process.pid,
                runtime=serving.runtime,
                model_dir=str(model_dir),
                key_file=str(folder / "key"),
                started=time.time(),
            ),
        )
    return endpoint
