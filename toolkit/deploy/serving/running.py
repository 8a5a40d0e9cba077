"""Which local endpoints are running, and stopping one from anywhere (`trainbook endpoints`, `... stop NAME`).

``serve()`` records each endpoint it starts in ``WORKSPACE/endpoints/NAME/endpoint.json`` (this module owns the
format). A record outlives its server (a killed terminal, a reboot), and a pid may be reused by any program, so a
record counts only while its pid is alive and that process is the endpoint's own server: the server carries the
endpoint's key-file path in its environment (KEY_FILE_ENV), which no other process has.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.errors import RefusedValue, bounded_repr, not_allowed
from toolkit.fsio import atomic_write_text, read_regular_file
from toolkit.deploy.serving.options import KEY_FILE_ENV

RECORD_NAME = "endpoint.json"
START_LOCK_NAME = "serve.lock"  # held by a `serve` from its check that none runs to its record (starting())
STOP_GRACE_S = 10.0  # SIGTERM, then this long to exit, then SIGKILL


@dataclass(frozen=True)
class RunningEndpoint:
    name: str
    url: str
    pid: int  # the server's; its process group is the endpoint's (the server leads a session of its own)
    runtime: str
    model_dir: str
    key_file: str
    started: float

    def as_dict(self) -> dict:
        return asdict(self)


RECORD_MAX_BYTES = 64 << 10  # a record is a few hundred bytes


def endpoint_folder(workspace_root: Path, name: str, error: type[Exception]) -> Path:
    """WORKSPACE/endpoints/NAME, made when missing, where an endpoint's key, record and log go. A link at either
    level is refused (as ``error``), never written through: the key would land wherever it points, and
    :func:`recorded_endpoints`, which passes linked folders over, could neither list nor stop the server."""
    root = workspace_root / "endpoints"
    for path in (root, root / name):
        if path.is_symlink():
            raise error(
                not_allowed(
                    "endpoint folder",
                    path,
                    "a folder of the workspace (a link is never written through)",
                    problem=f"is a symbolic link to {bounded_repr(os.readlink(path))}",
                )
            )
    (root / name).mkdir(parents=True, exist_ok=True)
    return root / name


def record(folder: Path, endpoint: RunningEndpoint) -> None:
    atomic_write_text(folder / RECORD_NAME, json.dumps(endpoint.as_dict(), indent=1))


def _endpoints_root(workspace) -> Path | None:
    from toolkit.catalogue.workspace import Workspace

    ws = Workspace.existing(workspace)  # listing never creates a workspace
    return ws.root / "endpoints" if ws else None


def _read(folder: Path) -> RunningEndpoint | None:
    """The folder's record; None if it has none, or one that does not name this folder (the folder is the name:
    a record copied or edited to name another endpoint must not make `stop` reach that one's server)."""
    try:
        text = read_regular_file(folder / RECORD_NAME, field=RECORD_NAME, error=RefusedValue, limit=RECORD_MAX_BYTES)
        endpoint = RunningEndpoint(**json.loads(text))
    except (OSError, ValueError, TypeError):  # none, half-written by hand, another version's, a link or a FIFO
        return None
    typed = (
        all(isinstance(getattr(endpoint, f), str) for f in ("name", "url", "runtime", "model_dir", "key_file"))
        and isinstance(endpoint.pid, int)
        and isinstance(endpoint.started, (int, float))
    )
    return endpoint if typed and endpoint.name == folder.name else None


def _is_its_server(endpoint: RunningEndpoint, folder: Path) -> bool:
    import psutil

    try:
        process = psutil.Process(endpoint.pid)
        return process.status() != psutil.STATUS_ZOMBIE and process.environ().get(KEY_FILE_ENV) == str(folder / "key")
    except (psutil.Error, OSError, ValueError):
        return False


def recorded_endpoints(workspace=None) -> list[tuple[RunningEndpoint, Path]]:
    """Every endpoint the workspace has served, running or not, by name, with its folder."""
    root = _endpoints_root(workspace)
    if root is None or not root.is_dir():
        return []
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    return [(endpoint, folder) for folder in folders if (endpoint := _read(folder)) is not None]


def running_endpoints(workspace=None) -> list[RunningEndpoint]:
    """The endpoints of the workspace whose server is alive, by name."""
    return [endpoint for endpoint, folder in recorded_endpoints(workspace) if _is_its_server(endpoint, folder)]


def running_in(folder: Path) -> RunningEndpoint | None:
    """The endpoint recorded in ``folder`` while its server is alive; None otherwise."""
    endpoint = _read(folder)
    return endpoint if endpoint is not None and _is_its_server(endpoint, folder) else None


@contextlib.contextmanager
def starting(folder: Path, error: type[Exception]):
    """Held while one `serve` checks that no server of this endpoint runs, starts one and records it: a second
    `serve` of the same name waits here, then finds the first one's record and is refused (with ``error``) naming
    it, instead of taking over its record and emptying its log."""
    fd = os.open(folder / START_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if (endpoint := running_in(folder)) is not None:
            raise error(
                not_allowed(
                    "--name",
                    endpoint.name,
                    "a name no running endpoint has (or `trainbook endpoints stop NAME` first)",
                    problem=f"is already served at {endpoint.url} (pid {endpoint.pid}, {endpoint.model_dir})",
                )
            )
        yield
    finally:
        os.close(fd)  # the lock goes with it


def stop_endpoint(name: str, workspace=None, grace_s: float = STOP_GRACE_S) -> RunningEndpoint:
    """Stop the running endpoint ``name`` (its server's whole process group): SIGTERM, then SIGKILL after
    ``grace_s``. The `trainbook serve` that started it notices and exits."""
    from toolkit.runs.processes import wait_for_exit

    running = {e.name: e for e in running_endpoints(workspace)}
    if name not in running:
        raise RefusedValue(
            not_allowed("name", name, ", ".join(running) or "none are running", problem="is not a running endpoint")
        )
    endpoint = running[name]
    try:
        os.killpg(endpoint.pid, signal.SIGTERM)  # checked just above to be this endpoint's own server
        if not wait_for_exit(endpoint.pid, grace_s):
            os.killpg(endpoint.pid, signal.SIGKILL)
            wait_for_exit(endpoint.pid, grace_s)
    except ProcessLookupError:
        pass  # it ended meanwhile
    return endpoint
