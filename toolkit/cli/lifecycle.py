"""Verbs for a run started elsewhere (another terminal, a notebook, `train ... &`): ``stop`` it, ``watch`` it,
``kill`` its training processes."""

from __future__ import annotations

import shlex
import sys

from toolkit.cli.conventions import add_verb


def register(verbs) -> None:
    from toolkit.runs.handle import STOP_WAIT_S  # imports no torch

    stop = add_verb(
        verbs,
        "stop",
        "stop a running run: it saves a checkpoint, then exits (resume continues it)",
        ["trainbook stop runs/demo-20261125-101500"],
    )
    stop.add_argument("run_dir", help="the run directory of a running run")
    stop.add_argument(
        "--timeout",
        type=float,
        default=STOP_WAIT_S,
        help=f"seconds to wait for the checkpoint before the run is killed (default: {STOP_WAIT_S:g})",
    )
    stop.set_defaults(func=cmd_stop)

    watch = add_verb(
        verbs,
        "watch",
        "follow a run started elsewhere: its progress bar until it ends (Ctrl-C leaves it running)",
        ["trainbook watch runs/demo-20261125-101500"],
    )
    watch.add_argument("run_dir", help="the run directory to follow")
    watch.set_defaults(func=cmd_watch)

    kill = add_verb(
        verbs,
        "kill",
        "SIGKILL a run's training processes (simulates a lost node)",
        ["trainbook kill RUN_DIR && trainbook resume RUN_DIR"],
    )
    kill.add_argument("run_dir", help="the run directory of a running run")
    kill.set_defaults(func=cmd_kill)


def cmd_stop(args) -> int:
    from toolkit.cli.following import resume_hint
    from toolkit.runs.handle import attach

    handle = attach(args.run_dir)
    print(
        f"stopping {handle.path}: a checkpoint at the next step (several processes: at the next log "
        f"interval), then the end; killed if it takes over {args.timeout:g} s",
        file=sys.stderr,
    )
    handle.stop(grace_s=args.timeout)
    status = handle.run.read_status()
    state, step = status.get("state"), status.get("step")
    latest = _latest_checkpoint(handle.path)
    print(
        f"{state} at step {step}; latest checkpoint: {latest or 'none'}"
        + (f"; {resume_hint(handle)}" if state != "completed" else "")
    )
    return 0 if state in ("stopped", "completed") else 1  # it may have reached its last step first


def _latest_checkpoint(run_dir) -> str | None:
    from toolkit.checkpoint.store import CheckpointStore

    return CheckpointStore(run_dir).latest_name()


def cmd_watch(args) -> int:
    from toolkit.cli.following import report_end
    from toolkit.runs.handle import attach
    from toolkit.runs.progress import RunProgress, follow_in_terminal
    from toolkit.rundir import RunDir
    from toolkit.status import FINAL_STATES

    run = RunDir(args.run_dir)
    status = run.read_status() if run.path.is_dir() else {}
    if status.get("state") in FINAL_STATES:  # nothing to follow: say how it ended
        print(
            f"{run.path} has {status['state']} at step {status.get('step')}"
            + (f" ({status['error']})" if status.get("error") else "")
        )
        return 0 if status["state"] in ("completed", "stopped") else 1
    handle = attach(run)
    progress = RunProgress(run.read_config().train.max_steps)
    try:  # from the first line on, Ctrl-C only ends the watching
        print(f"run directory: {handle.path}  (Ctrl-C stops watching; the run goes on)", file=sys.stderr, flush=True)
        final = follow_in_terminal(handle, progress.max_steps, progress=progress)
    except KeyboardInterrupt:
        print(
            f"stopped watching at step {progress.step}; the run goes on: "
            f"trainbook watch {shlex.quote(str(handle.path))}",
            file=sys.stderr,
        )
        return 130
    return report_end(handle, progress, final)


def cmd_kill(args) -> int:
    from toolkit.runs.handle import kill_training

    if not kill_training(args.run_dir):
        print(f"error: no training processes running for {args.run_dir}", file=sys.stderr)
        return 1
    print(f"sent SIGKILL to the training processes of {args.run_dir}")
    return 0
