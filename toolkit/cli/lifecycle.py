"""Verbs for what runs in the background, started elsewhere (another terminal, a notebook, `serve ... &`):
``stop`` and ``watch`` a run, list and stop ``endpoints``."""

from __future__ import annotations

import shlex
import sys


def cmd_stop(args) -> int:
    from toolkit.cli.following import resume_hint
    from toolkit.runs.handle import attach

    handle = attach(args.run_dir)
    print(f"stopping {handle.path}: a checkpoint at the next step (several processes: at the next log "
          f"interval), then the end; killed if it takes over {args.timeout:g} s", file=sys.stderr)
    handle.stop(grace_s=args.timeout)
    status = handle.run.read_status()
    state, step = status.get("state"), status.get("step")
    latest = _latest_checkpoint(handle.path)
    print(f"{state} at step {step}; latest checkpoint: {latest or 'none'}"
          + (f"; {resume_hint(handle)}" if state != "completed" else ""))
    return 0 if state in ("stopped", "completed") else 1  # it may have reached its last step first


def _latest_checkpoint(run_dir) -> str | None:
    from toolkit.checkpoint.store import CheckpointStore

    return CheckpointStore(run_dir).latest_name()


def cmd_watch(args) -> int:
    from toolkit.cli.following import report_end
    from toolkit.runs.handle import attach
    from toolkit.runs.progress import RunProgress, follow_in_terminal
    from toolkit.runs.rundir import RunDir
    from toolkit.runs.status import FINAL_STATES

    run = RunDir(args.run_dir)
    status = run.read_status() if run.path.is_dir() else {}
    if status.get("state") in FINAL_STATES:  # nothing to follow: say how it ended
        print(f"{run.path} has {status['state']} at step {status.get('step')}"
              + (f" ({status['error']})" if status.get("error") else ""))
        return 0 if status["state"] in ("completed", "stopped") else 1
    handle = attach(run)
    progress = RunProgress(run.read_config().train.max_steps)
    try:  # from the first line on, Ctrl-C only ends the watching
        print(f"run directory: {handle.path}  (Ctrl-C stops watching; the run goes on)", file=sys.stderr, flush=True)
        final = follow_in_terminal(handle, progress.max_steps, progress=progress)
    except KeyboardInterrupt:
        print(f"stopped watching at step {progress.step}; the run goes on: "
              f"trainbook watch {shlex.quote(str(handle.path))}", file=sys.stderr)
        return 130
    return report_end(handle, progress, final)


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
    print(f"{'endpoint':<16} {'url':<28} {'pid':>7} {'runtime':<8} {'model':<40} key file")
    for e in endpoints:
        print(f"{e.name:<16} {e.url:<28} {e.pid:>7} {e.runtime:<8} {str(e.model_dir):<40} {e.key_file}")
    return 0
