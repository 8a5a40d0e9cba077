"""The ``trainbook`` command line (also ``python -m toolkit``): one verb per job, each a thin toolkit call."""

from __future__ import annotations

import argparse
import signal
import sys

from toolkit.config import ConfigError


def _cmd_train(args) -> int:
    from toolkit import config as config_mod
    from toolkit import launch
    from toolkit.progress import follow_in_terminal

    overrides = list(args.set or [])
    if args.nproc is not None:
        overrides.append(f"engine.nproc={args.nproc}")
    if args.engine is not None:
        overrides.append(f"engine.name={args.engine}")
    cfg = config_mod.load(args.config, overrides)  # every validation error surfaces here, before any start
    handle = launch.start(cfg, run_dir=args.run_dir, runs_root=args.runs_root)
    print(f"run directory: {handle.path}", file=sys.stderr)
    try:
        final = follow_in_terminal(handle, cfg.train.max_steps)
    except KeyboardInterrupt:
        print("interrupted: stopping the run", file=sys.stderr)
        handle.stop()
        return 130
    code = handle.wait()
    status = handle.run.read_status()
    summary = ", ".join(f"{k}={final[k]:.4g}" for k in ("val_loss", "val_bpb", "train_seconds") if k in final)
    print(f"{status.get('state')}: step {status.get('step')} {summary}".rstrip(), file=sys.stderr)
    if code != 0:
        print(f"training failed (exit code {code}); log: {handle.path / launch.LOG_NAME}", file=sys.stderr)
    return 0 if code == 0 else 1


def _cmd_tensorboard(args) -> int:
    from toolkit.tb_server import start_tensorboard

    server = start_tensorboard(args.run_dir, port=args.port)
    print(f"TensorBoard for {args.run_dir}: {server.url}  (Ctrl-C stops it)")
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainbook", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)

    train = verbs.add_parser("train", help="train in the foreground with a progress bar")
    train.add_argument("config", help="a YAML file, or the name of one in configs/ (e.g. tiny, demo)")
    train.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                       help="override one config field (repeatable), e.g. --set train.max_steps=50")
    train.add_argument("--run-dir", help="run directory (default: <runs-root>/<name>-<timestamp>)")
    train.add_argument("--runs-root", help="where new run directories go (default: $TRAINBOOK_RUNS or ./runs "
                       "of the project)")
    train.add_argument("--nproc", type=int, help="processes on this machine (engine.nproc)")
    train.add_argument("--engine", help="torch or deepspeed (engine.name)")
    train.set_defaults(func=_cmd_train)

    tb = verbs.add_parser("tensorboard", help="serve a run's scalars and profiler traces on 127.0.0.1")
    tb.add_argument("run_dir")
    tb.add_argument("--port", type=int, help="port (default: a free one)")
    tb.set_defaults(func=_cmd_tensorboard)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
