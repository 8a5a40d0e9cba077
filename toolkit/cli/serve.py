"""``trainbook serve``: a local online endpoint (Azure ML's scoring contract) on 127.0.0.1; ``trainbook endpoints``:
the local endpoints that are running (started here, in another terminal or with `serve ... &`), and stopping one."""

from __future__ import annotations

import signal
import sys

from toolkit.cli.common import add_json, add_workspace
from toolkit.cli.conventions import add_verb, add_verbs
from toolkit.cli.following import Terminated, raise_terminated
from toolkit.tables import Column, text_table


def register(verbs) -> None:
    from toolkit.deploy.serving.options import WEIGHTS  # runtime -> the weights file it loads
    from toolkit.deploy.serving.protocol import REQUEST_TIMEOUT_S  # a plain module of limits: no server imported

    serve = add_verb(
        verbs,
        "serve",
        "a local online endpoint (Azure ML's scoring contract) on 127.0.0.1",
        ["trainbook serve demo", "trainbook serve RUN_DIR/model --runtime torch --port 8081 &"],
    )
    serve.add_argument("model", help="a model folder, or a registered NAME[:VERSION]")
    serve.add_argument("--port", type=int, help="port (default: a free one)")
    serve.add_argument(
        "--runtime",
        choices=list(WEIGHTS),
        help="default: torch for a transformers model, which generates with a KV cache; onnx for the built-in models",
    )
    serve.add_argument(
        "--name", help="the endpoint's name (default: the run's); one running endpoint per name in a workspace"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--max-batch", type=int, default=16, help="requests per forward pass (1: no batching)")
    serve.add_argument("--max-wait-ms", type=float, default=5.0, help="how long an idle model waits to fill a batch")
    serve.add_argument(
        "--request-timeout",
        type=float,
        default=REQUEST_TIMEOUT_S,
        help=f"seconds a request may wait for its answer before a 503 (default {REQUEST_TIMEOUT_S:g})",
    )
    add_workspace(serve)
    serve.set_defaults(func=cmd_serve)

    endpoints = add_verb(
        verbs,
        "endpoints",
        "local endpoints that are running: model, URL, pid, key file",
        ["trainbook endpoints", "trainbook endpoints stop demo"],
    )
    add_workspace(endpoints)
    add_json(endpoints, "the running endpoints")
    endpoint_verbs = add_verbs(endpoints, "endpoints_verb", required=False)
    estop = add_verb(endpoint_verbs, "stop", "stop a running endpoint by name", ["trainbook endpoints stop demo"])
    estop.add_argument("name", help="the endpoint's name (the first column of `trainbook endpoints`)")
    add_workspace(estop, below_group=True)
    endpoints.set_defaults(func=cmd_endpoints)


def cmd_serve(args) -> int:
    import shlex
    import warnings

    from toolkit.deploy.serving.endpoint import PlainHTTPWarning, serve

    with warnings.catch_warnings(record=True) as caught:  # one plain line, before any error that follows it
        warnings.simplefilter("always", PlainHTTPWarning)
        try:
            endpoint = serve(
                args.model,
                port=args.port,
                runtime=args.runtime,
                host=args.host,
                name=args.name,
                max_batch=args.max_batch,
                max_wait_ms=args.max_wait_ms,
                workspace=args.workspace,
                request_timeout=args.request_timeout,
            )
        finally:
            for warning in caught:
                print(f"warning: {warning.message}", file=sys.stderr, flush=True)
    key_file = shlex.quote(str(endpoint.folder / "key"))
    key = endpoint.key_file
    assert key is not None  # serve() always sets it
    example = '{"text": "What a lovely day"}' if endpoint.tasks[0] == "classify" else '{"prompt": "def "}'
    if key.note:
        print(f"note: {key.note}", file=sys.stderr, flush=True)
    print(
        f"{endpoint.describe()}\n  key file ({key.mode_text}): {key.path}\n"
        f"  log: {endpoint.log_path}\n"
        f"  try: curl -H \"Authorization: Bearer $(cat {key_file})\" -d '{example}' "
        + endpoint.scoring_url
        + (
            f"\n  OpenAI's API: openai.OpenAI(base_url={endpoint.openai_url!r}, api_key=<the key>)"
            if "generate" in endpoint.tasks
            else ""
        )
        + f"\n(Ctrl-C or `trainbook endpoints stop {endpoint.name}` stops it)",
        flush=True,
    )
    return _serve_until_stopped(endpoint)


def _serve_until_stopped(endpoint) -> int:
    """Until Ctrl-C or SIGTERM here (then stop the server), or until the server ends by itself or is stopped
    from elsewhere (`trainbook endpoints stop`): waiting on its exit, not polling."""
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        code = endpoint.process.wait()
    except (KeyboardInterrupt, Terminated):
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        endpoint.stop()
    print(
        f"endpoint {endpoint.name} stopped" + (f" (exit code {code}; log: {endpoint.log_path})" if code else ""),
        file=sys.stderr,
    )
    return 0 if code == 0 else 1


def cmd_endpoints(args) -> int:
    from toolkit.deploy.serving.running import running_endpoints, stop_endpoint

    if args.endpoints_verb == "stop":
        stopped = stop_endpoint(args.name, workspace=args.workspace)
        print(f"stopped endpoint {stopped.name} ({stopped.url}, pid {stopped.pid})")
        return 0
    endpoints = running_endpoints(args.workspace)
    if getattr(args, "json", False):
        import json

        print(json.dumps({"endpoints": [e.as_dict() for e in endpoints]}, indent=1))
        return 0
    if not endpoints:
        print("no endpoints running: try `trainbook serve MODEL &` (`trainbook models` lists the registered ones)")
        return 0
    print(
        text_table(
            endpoints,
            [
                Column("endpoint", "name"),
                Column("url", "url"),
                Column("pid", "pid", right=True),
                Column("runtime", "runtime"),
                Column("model", "model_dir"),
                Column("key file", "key_file"),
            ],
        )
    )
    return 0
