"""Azure ML's scoring contract: ``init()`` loads the model from AZUREML_MODEL_DIR, ``run(request)`` answers.

The same file runs in Azure ML's managed online endpoint and in Trainbook's local endpoint (Azure ML's own
inference server, azureml-inference-server-http). It is decorated with ``@rawhttp`` so it sees the method,
the headers and the raw body: that is what lets it answer 400/401/413 itself and never a 500 for bad input.

Settings come from environment variables (the deployment's environment_variables on Azure ML): the
ServingOptions (toolkit.deploy.serving.options: TRAINBOOK_RUNTIME, TRAINBOOK_MAX_BATCH, TRAINBOOK_MAX_WAIT_MS,
TRAINBOOK_REQUEST_TIMEOUT_S, ...), and TRAINBOOK_KEY_FILE, local endpoint only: the key requests must carry (on
Azure ML the endpoint checks keys before a request reaches this script).
"""

from __future__ import annotations

import os
import select
import socket
import sys
from pathlib import Path

# Azure ML runs this file from its code folder: make the project importable (the folder holding toolkit/).
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from azureml_inference_server_http.api.aml_request import rawhttp  # noqa: E402
from azureml_inference_server_http.api.aml_response import AMLResponse  # noqa: E402

from toolkit.deploy.serving.options import KEY_FILE_ENV, ServingOptions  # noqa: E402
from toolkit.deploy.serving.protocol import RequestError  # noqa: E402
from toolkit.deploy.serving.runtimes import find_model_dir  # noqa: E402
from toolkit.deploy.serving.service import ScoringService  # noqa: E402
from toolkit import key_files  # noqa: E402
from toolkit.errors import refused  # noqa: E402
from toolkit.startup import long_lived  # noqa: E402

service: ScoringService | None = None


def init() -> None:
    global service
    key_file = os.environ.get(KEY_FILE_ENV)
    with long_lived():  # torch and the model, loaded once for the server's life
        service = ScoringService(
            find_model_dir(os.environ["AZUREML_MODEL_DIR"]),
            ServingOptions.from_environment(),
            key=key_files.read(Path(key_file), "the endpoint key") if key_file else None,
        )


@rawhttp
def run(request):
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

    status, payload = service.handle(
        request.method,
        request.headers.get("Authorization"),
        request.content_length,
        read_body,
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
