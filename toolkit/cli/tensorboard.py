"""``trainbook tensorboard``: serve a run's scalars and profiler traces on 127.0.0.1."""

from __future__ import annotations

import signal

from toolkit.cli.conventions import add_verb


def register(verbs) -> None:
    tb = add_verb(
        verbs,
        "tensorboard",
        "serve a run's scalars and profiler traces on 127.0.0.1",
        ["trainbook tensorboard RUN_DIR", "trainbook tensorboard RUN_DIR --port 6006"],
    )
    tb.add_argument("run_dir", help="the run directory")
    tb.add_argument("--port", type=int, help="port (default: a free one)")
    tb.set_defaults(func=cmd_tensorboard)


def cmd_tensorboard(args) -> int:
    from toolkit.runs.tensorboard import start_tensorboard

    server = start_tensorboard(args.run_dir, port=args.port)
    print(f"TensorBoard for {args.run_dir}: {server.url}  (Ctrl-C stops it)")
    return _serve_until_interrupted(server.stop)


def _serve_until_interrupted(stop) -> int:
    """Block until Ctrl-C or SIGTERM, then ``stop()`` what the verb started (a server in another process)."""
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        stop()
    return 0
