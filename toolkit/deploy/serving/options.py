"""The serving options: one bounded dataclass for the local endpoint (``serve``), score.py (locally and on Azure
ML) and the Azure deployment plan, and the environment variables that carry it to the server process.

    options = ServingOptions(runtime="torch", max_batch=8)   # refused here, naming the flag, if out of bounds
    env = options.environment()                              # what the server process is started with
    ServingOptions.from_environment()                        # what score.py and the HTTP worker read back
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping

from toolkit.catalogue.model_format import ExportError
from toolkit.deploy.serving.protocol import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, REQUEST_TIMEOUT_S, TEXT_TASKS
from toolkit.errors import UserError, not_allowed

WEIGHTS = {"onnx": "model.onnx", "torch": "model.safetensors"}  # runtime -> the weights file it loads
MAX_BATCH = 256
MAX_WAIT_MS = 1000
MAX_THREADS = 256
TIMEOUT_S = (0.5, 3600.0)  # any timeout's bounds: above a network round trip, below an hour


class ServingOptionsError(UserError, ValueError):
    """An option out of bounds; the message names the flag, the value and what is allowed."""


@dataclass(frozen=True)
class ServingOptions:
    runtime: str = "onnx"
    """Which weights the server loads: onnx (model.onnx, onnxruntime) or torch (model.safetensors)."""
    max_batch: int = 16
    """Requests batched into one forward pass, 1 to 256 (1 turns batching off)."""
    max_wait_ms: float = 5.0
    """How long an idle model waits for a batch to fill, 0 to 1000 ms."""
    threads: int = 32
    """Concurrent requests the server process accepts (the batcher serialises the model's work)."""
    header_timeout: float = HEADER_TIMEOUT_S
    """Seconds a client has to send its request head (408 after)."""
    body_timeout: float = BODY_TIMEOUT_S
    """Seconds a client has to send its body once the head is in (408 after)."""
    request_timeout: float = REQUEST_TIMEOUT_S
    """Seconds a request may wait for its answer, the model's queue included (503 after)."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if problem := _problem(f.name, getattr(self, f.name)):
                raise ServingOptionsError(not_allowed(flag(f.name), getattr(self, f.name), problem))

    def environment(self) -> dict[str, str]:
        """The variables score.py and the HTTP server read: every option, one worker process with its threads."""
        env = {ENV[name]: str(getattr(self, name)) for name in ENV}
        env.update({"WORKER_COUNT": "1", "GUNICORN_CMD_ARGS": f"--threads {self.threads}"})
        return env

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> ServingOptions:
        """The options a server process was started with (defaults for what is not set)."""
        kinds = {f.name: f.type for f in dataclasses.fields(cls)}
        given = {}
        for name, variable in ENV.items():
            if variable in env:
                convert = {"int": int, "float": float}.get(kinds[name], str)
                try:
                    given[name] = convert(env[variable])
                except ValueError:
                    raise ServingOptionsError(not_allowed(variable, env[variable], _problem(name, None))) from None
        return cls(**given)


ENV = {
    "runtime": "TRAINBOOK_RUNTIME",
    "max_batch": "TRAINBOOK_MAX_BATCH",
    "max_wait_ms": "TRAINBOOK_MAX_WAIT_MS",
    "threads": "TRAINBOOK_THREADS",
    "header_timeout": "TRAINBOOK_HEADER_TIMEOUT_S",
    "body_timeout": "TRAINBOOK_BODY_TIMEOUT_S",
    "request_timeout": "TRAINBOOK_REQUEST_TIMEOUT_S",
}
KEY_FILE_ENV = "TRAINBOOK_KEY_FILE"  # local endpoint only (Azure ML checks keys itself): the file holding the key
# gunicorn takes its threads from GUNICORN_CMD_ARGS; TRAINBOOK_THREADS says the same to our own code


def flag(name: str) -> str:
    """The command-line spelling of an option, which error messages use: ``--max-batch``."""
    return "--" + name.replace("_", "-")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _problem(name: str, value) -> str | None:
    """What is allowed for option ``name`` when ``value`` is not (None when it is)."""
    if name == "runtime":
        return None if value in WEIGHTS else ", ".join(WEIGHTS)
    low, high, unit, integer = {  # the unit is in the flag's name where it is not written here
        "max_batch": (1, MAX_BATCH, "", True),
        "threads": (1, MAX_THREADS, "", True),
        "max_wait_ms": (0, MAX_WAIT_MS, "", False),
    }.get(name, (*TIMEOUT_S, " seconds", False))
    ok = _number(value) and (isinstance(value, int) or not integer) and low <= value <= high
    return None if ok else f"{low:g} to {high:g}{unit}"


# --- what a folder serves -----------------------------------------------------------------------------------------

# (model, task) -> the requests an endpoint over it answers (toolkit.deploy.serving.protocol's task names)
SERVED_TASKS = {
    ("gpt", None): TEXT_TASKS,
    ("hf", "causal_lm"): TEXT_TASKS,
    ("hf", "sequence_classification"): ("classify",),
}


def served_tasks(manifest: dict) -> tuple[str, ...]:
    """What an endpoint over this export answers, the first being a request's default; refused, naming the model
    and its task, for a model no endpoint serves (the digits MLP: its inputs are not text)."""
    model, task = manifest.get("model"), manifest.get("task")
    tasks = SERVED_TASKS.get((model, task if model == "hf" else None))
    if tasks is None:
        what = f"{model} ({task})" if model == "hf" else model
        kinds = ", ".join(m if t is None else f"{m} ({t})" for m, t in SERVED_TASKS)
        raise ExportError(not_allowed("model", what, kinds, problem="cannot be served"))
    return tasks


def default_runtime(manifest: dict) -> str:
    """The runtime a folder is served with when none is asked for: torch for a transformers model (it generates
    with a KV cache, ONNX Runtime recomputes the whole context for every token), ONNX Runtime for the built-ins."""
    return "torch" if manifest.get("model") == "hf" else "onnx"


def check_runtime(folder: str | Path, manifest: dict, runtime: str | None) -> str:
    """``runtime`` (or the folder's default), once the folder has the weights it loads; without them refused,
    naming the file, the other runtime, and why the export left it out (an architecture ONNX cannot export)."""
    runtime = runtime or default_runtime(manifest)
    if runtime not in WEIGHTS:
        raise ExportError(not_allowed("runtime", runtime, ", ".join(WEIGHTS)))
    weights = WEIGHTS[runtime]
    if not (Path(folder) / weights).is_file():  # whether the manifest lists it is verify_model_folder's to say
        other = next(r for r in WEIGHTS if r != runtime)
        why = manifest.get("onnx_not_exported") if runtime == "onnx" else None
        raise ExportError(
            not_allowed(
                "model",
                folder,
                f"a folder with {weights}, or --runtime {other}",
                problem=f"has no {weights}, which --runtime {runtime} loads"
                + (f" (the export could not write it: {str(why)[:300]})" if why else ""),
            )
        )
    return runtime
