"""Azure ML's scoring contract: ``init()`` loads the model from AZUREML_MODEL_DIR, ``run(request)`` answers.

The same file runs in Azure ML's managed online endpoint and in Trainbook's local endpoint (Azure ML's own
inference server, azureml-inference-server-http). It is decorated with ``@rawhttp`` so it sees the method,
the headers and the raw body: that is what lets it answer 400/401/413 itself and never a 500 for bad input.

A model that generates also answers OpenAI's API (/v1: toolkit.deploy.serving.openai_api), added to the server's
Flask blueprint by :func:`add_openai_routes`.

Settings come from environment variables (the deployment's environment_variables on Azure ML): the
ServingOptions (toolkit.deploy.serving.options: TRAINBOOK_RUNTIME, TRAINBOOK_MAX_BATCH, TRAINBOOK_MAX_WAIT_MS,
TRAINBOOK_REQUEST_TIMEOUT_S, ...), and TRAINBOOK_KEY_FILE, local endpoint only: the key requests must carry (on
Azure ML the endpoint checks keys before a request reaches this script).
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
from functools import partial
from pathlib import Path

# Azure ML runs this file from its code folder: make the project importable (the folder holding toolkit/).
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from azureml_inference_server_http.api.aml_request import rawhttp  # noqa: E402
from azureml_inference_server_http.api.aml_response import AMLResponse  # noqa: E402

from toolkit.deploy.serving.openai_api import OpenAIRoutes, error  # noqa: E402
from toolkit.deploy.serving.options import KEY_FILE_ENV, ServingOptions  # noqa: E402
from toolkit.deploy.serving.protocol import RequestError  # noqa: E402
from toolkit.deploy.serving.runtimes import find_model_dir  # noqa: E402
from toolkit.deploy.serving.service import ScoringService  # noqa: E402
from toolkit import key_files  # noqa: E402
from toolkit.errors import refused  # noqa: E402
from toolkit.startup import long_lived  # noqa: E402

service: ScoringService | None = None
openai: OpenAIRoutes | None = None  # /v1, for a model that generates


def init() -> None:
    global service, openai
    key_file = os.environ.get(KEY_FILE_ENV)
    with long_lived():  # torch and the model, loaded once for the server's life
        service = ScoringService(
            find_model_dir(os.environ["AZUREML_MODEL_DIR"]),
            ServingOptions.from_environment(),
            key=key_files.read(Path(key_file), "the endpoint key") if key_file else None,
        )
    openai = OpenAIRoutes(service) if "generate" in service.runtime.tasks else None
    add_openai_routes()


def add_openai_routes() -> None:
    """OpenAI's API (/v1: toolkit.deploy.serving.openai_api) beside /score, on the inference server's own Flask
    blueprint, so its request ids, headers and logs apply. azmlinfsrv calls init() while it registers that blueprint
    (AMLInferenceBlueprint.setup, before Blueprint.register), so the routes added here are registered with it."""
    from azureml_inference_server_http.server import routes

    blueprint = routes.main_blueprint
    blueprint.add_url_rule("/v1/models", "openai_models", _openai_models, methods=["GET"])
    for kind, path in (("chat", "/v1/chat/completions"), ("completions", "/v1/completions")):
        blueprint.add_url_rule(path, f"openai_{kind}", partial(_openai_answer, kind), methods=["POST"])


def _openai_response(answer):
    from flask import Response

    if isinstance(answer, tuple):
        status, payload = answer
        return Response(json.dumps(payload), status, mimetype="application/json")
    return Response(answer, 200, mimetype="text/event-stream", headers={"Cache-Control": "no-cache"})


def _openai_models():
    from flask import request

    if openai is None:
        return _openai_response(error(404, "this endpoint's model does not generate text: POST /score classifies"))
    return _openai_response(openai.models(request.headers.get("Authorization")))


def _openai_answer(kind: str):
    from flask import request

    if openai is None:
        return _openai_response(error(404, "this endpoint's model does not generate text: POST /score classifies"))
    answer = openai.answer(
        kind,
        request.headers.get("Authorization"),
        request.content_length,
        body_reader(request),
        hung_up(request.environ.get("gunicorn.socket")),
    )
    return _openai_response(answer)


def body_reader(request):
    """``read(limit)``: the request's body, at most ``limit`` bytes (framing errors are the client's: 400)."""

    def read_body(limit: int) -> bytes:
        chunks, size = [], 0
        try:
            while size < limit and (chunk := request.stream.read(limit - size)):
                chunks.append(chunk)
                size += len(chunk)
        except Exception as exc:  # the server decodes the framing (chunks, trailers) as we read: the client's error
            raise RequestError(
                refused(
                    "body",
                    f"could not be read ({str(exc)[:80] or type(exc).__name__})",
                    "a body framed by Content-Length or valid chunked encoding (RFC 9112)",
                )
            ) from None
        return b"".join(chunks)

    return read_body


@rawhttp
def run(request):
    status, payload = service.handle(
        request.method,
        request.headers.get("Authorization"),
        request.content_length,
        body_reader(request),
        hung_up(request.environ.get("gunicorn.socket")),
    )
    return AMLResponse(payload, status, json_str=True)


def hung_up(sock: socket.socket | None):
    """A check whether the client closed the connection ``sock`` while its request waits (None: no socket to
    look at). A closed connection reads as end-of-file; a pipelined next request is data, not a hang-up.
    A client that half-closes its side after the request counts as gone: HTTP/1.1 clients do not do that."""
    if sock is None:
        return None

    def gone() -> bool:
        poller = select.poll()  # select() fails on descriptors past 1024
        poller.register(sock, select.POLLIN)
        if not poller.poll(0):
            return False
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""  # readable: returns at once
        except OSError:
            return True

    return gone
