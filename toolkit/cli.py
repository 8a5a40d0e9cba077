"""The ``trainbook`` command line (also ``python -m toolkit``): one verb per job, each a thin toolkit call."""

from __future__ import annotations

import argparse
import gc
import json
import signal
import sys
import time
from pathlib import Path

from toolkit.config import ConfigError
from toolkit.errors import not_allowed, refused


def _cmd_train(args) -> int:
    from toolkit import config as config_mod
    from toolkit.runs import launch

    overrides = list(args.set or [])
    if args.nproc is not None:
        overrides.append(f"engine.nproc={args.nproc}")
    if args.engine is not None:
        overrides.append(f"engine.name={args.engine}")
    cfg = config_mod.load(args.config, overrides)  # every validation error surfaces here, before any start
    if args.max_restarts < 0:
        raise ConfigError(not_allowed("--max-restarts", args.max_restarts, "0 or more", problem="is negative"))
    return _start_and_follow(lambda: launch.start(cfg, run_dir=args.run_dir, runs_root=args.runs_root,
                                                  max_restarts=args.max_restarts))


def _cmd_resume(args) -> int:
    from toolkit.runs import launch

    if args.max_restarts < 0:
        raise ConfigError(not_allowed("--max-restarts", args.max_restarts, "0 or more", problem="is negative"))

    def start():
        try:
            handle = launch.resume(args.run_dir, max_restarts=args.max_restarts,
                                   from_checkpoint=args.from_checkpoint)
        except launch.NothingToResume as done:
            print(done, file=sys.stderr)
            return None
        print(handle.plan, file=sys.stderr)
        return handle

    return _start_and_follow(start)


class _Terminated(Exception):
    """SIGTERM or SIGHUP reached the foreground CLI (`timeout`, a closed terminal, a cancelled CI job)."""


def _raise_terminated(signum, frame):
    raise _Terminated(signum)


def _start_and_follow(start) -> int:
    """Start a run (``start()`` returns its handle, or None when nothing was started) and follow it to its end.
    The signals that stop a run are caught from before the start: one that arrives while the run is starting is
    remembered and stops the run as soon as its handle exists (raised inside the start, it would kill the CLI
    alone, or leave a supervisor started with no handle to stop it: a run training on, detached)."""
    pending: list[int] = []
    stop_signals = [sig for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # a shell's ignored Ctrl-C stays so
                    if not (sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN)]
    previous = {sig: signal.signal(sig, lambda signum, frame: pending.append(signum)) for sig in stop_signals}
    try:
        handle = start()
        if handle is None:
            return 128 + pending[0] if pending else 0
        return _follow(handle, handle.run.read_config().train.max_steps, pending, previous)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _follow(handle, max_steps: int, pending: list[int], previous: dict) -> int:
    """Follow the run in the terminal until it ends. Ctrl-C, SIGTERM and SIGHUP stop the run with the CLI: it
    runs in its own session, so without this a closed terminal would leave it training, detached. ``pending``:
    the signals that arrived while it started; ``previous``: the handlers to restore once it has ended."""
    from toolkit.runs.progress import RunProgress, follow_in_terminal

    # What the start left on the heap stays till the end: the pre-launch checks of a Hugging Face model import
    # transformers (~400k objects). Frozen, the collector no longer rescans it whenever following the run allocates:
    # measured on `train llama`, the follower's CPU over the training fell from ~1 CPU s (9% of a core, taken from
    # the worker's two) to 0.04.
    gc.freeze()
    progress = RunProgress(max_steps)
    try:  # from here every stop signal raises, into the except below (handle.stop())
        for sig in previous:
            signal.signal(sig, previous[sig] if sig == signal.SIGINT else _raise_terminated)
        print(f"run directory: {handle.path}", file=sys.stderr)
        if pending:  # arrived while the run was starting
            raise _Terminated(pending[0])
        final = follow_in_terminal(handle, max_steps, progress=progress)
    except (KeyboardInterrupt, _Terminated) as exc:
        signum = exc.args[0] if isinstance(exc, _Terminated) else signal.SIGINT
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a second signal must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        _tell(f"interrupted ({signal.Signals(signum).name}): stopping the run")
        handle.stop()
        _tell(_stopped_message(handle, _last_step(handle, progress)))
        return 128 + signum
    finally:  # the run has ended or been stopped: a signal now ends the CLI the ordinary way
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = handle.wait()
    status = handle.run.read_status()
    state, step = status.get("state"), _last_step(handle, progress)
    figures = {k: getattr(final, k) for k in ("val_loss", "val_bpb", "train_seconds")} if final else {}
    summary = ", ".join(f"{k}={v:.4g}" for k, v in figures.items() if v is not None)
    from toolkit.runs.supervisor import LOG_NAME

    if state == "killed":
        cause = str(status.get("error") or "a signal").removeprefix("signal ")
        print(f"killed by {cause} at step {step} (the last step logged)\n{_resume_hint(handle)}", file=sys.stderr)
    elif state == "stopped":  # stopped from elsewhere (a stop button, a SIGTERM to the supervisor): not a failure
        print(_stopped_message(handle, step), file=sys.stderr)
    else:
        print(f"{state}: step {step} {summary}".rstrip(), file=sys.stderr)
        if code != 0:
            print(f"training failed (exit code {code}); log: {handle.path / LOG_NAME}", file=sys.stderr)
    return 0 if code == 0 else 1


def _last_step(handle, progress) -> int | None:
    """The last step the run logged: from its events (status.json's step is refreshed only every few seconds)."""
    return progress.step if progress.train else handle.run.read_status().get("step")


def _stopped_message(handle, step: int | None) -> str:
    return f"stopped at step {step}; {_resume_hint(handle)}"


def _resume_hint(handle) -> str:
    import shlex

    from toolkit.runs.supervisor import LOG_NAME

    return (f"to continue from its latest checkpoint: trainbook resume {shlex.quote(str(handle.path))}  "
            f"(log: {handle.path / LOG_NAME})")


def _tell(message: str) -> None:
    """Print to a terminal that may be gone (SIGHUP): the run must still be stopped if the write fails."""
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:
        pass


def _cmd_checkpoints(args) -> int:
    from toolkit.checkpoint.store import CheckpointStore

    if not Path(args.run_dir).is_dir():
        raise FileNotFoundError(not_allowed("run_dir", args.run_dir, "a run directory", problem="is not a folder"))
    store = CheckpointStore(args.run_dir)
    infos = store.list(verify=not args.quick)
    if not infos:
        print(f"no checkpoints in {store.root}")
        return 0
    latest = store.latest_name()
    print(f"{'checkpoint':<24} {'step':>8} {'size':>10} {'age':>8}  state")
    for info in infos:
        age = f"{time.time() - info.created:,.0f} s" if info.created else "-"
        mark = " <- LATEST" if info.name == latest else ""
        step = f"{info.step:,}" if info.step is not None else "-"
        state = "valid" if info.valid else f"INVALID: {info.reason}"
        print(f"{info.name:<24} {step:>8} {info.size_bytes / 2**20:>8.1f} MB {age:>8}  {state}{mark}")
    return 0


def _cmd_kill(args) -> int:
    from toolkit.runs.handle import kill_training

    if not kill_training(args.run_dir):
        print(f"error: no training processes running for {args.run_dir}", file=sys.stderr)
        return 1
    print(f"sent SIGKILL to the training processes of {args.run_dir}")
    return 0


def _cmd_advise(args) -> int:
    from toolkit.checkpoint.interval_advisor import advise_for_run, mtbf_for_gpus

    if args.mtbf_hours is not None and args.mtbf_hours <= 0:
        raise ConfigError(not_allowed("--mtbf-hours", args.mtbf_hours, "a positive number"))
    if args.gpus < 1:
        raise ConfigError(not_allowed("--gpus", args.gpus, "1 or more"))
    mtbf = args.mtbf_hours * 3600 if args.mtbf_hours is not None else mtbf_for_gpus(args.gpus)
    print(advise_for_run(args.run_dir, mtbf_s=mtbf, restart_s=args.restart_seconds).summary())
    return 0


def _print_asset(asset) -> None:
    tags = ", ".join(f"{k}={v}" for k, v in sorted(asset.tags.items()))
    print(f"{asset.ref}  ({asset.type}{', archived' if asset.archived else ''})\n"
          f"  sha256   {asset.sha256}\n  size     {asset.size_bytes:,} bytes in {asset.file_count} file(s)\n"
          f"  snapshot {asset.path}\n  source   {asset.source}\n"
          + (f"  about    {asset.description}\n" if asset.description else "")
          + (f"  tags     {tags}\n" if tags else ""), end="")


def _parse_tags(pairs) -> dict:
    tags = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(not_allowed("--tag", pair, "key=value"))
        tags[key] = value
    return tags


def _cmd_data(args) -> int:
    from toolkit.catalogue import data_assets, data_verify
    from toolkit.catalogue.workspace import Workspace

    ws = Workspace.open(args.workspace)
    if args.data_verb == "register":
        asset = data_assets.register(ws, args.name, args.path, type=args.type, description=args.description,
                                     tags=_parse_tags(args.tag))
        print(asset.ref)
    elif args.data_verb == "list":
        assets = data_assets.list_assets(ws, name=args.name, include_archived=args.all, tag=args.tag)
        print(f"{'asset':<28} {'type':<11} {'size':>12} {'files':>6}  {'created':<19} tags")
        for a in assets:
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.created))
            tags = ",".join(f"{k}={v}" for k, v in sorted(a.tags.items()))
            print(f"{a.ref + (' (archived)' if a.archived else ''):<28} {a.type:<11} {a.size_bytes:>12,} "
                  f"{a.file_count:>6}  {created:<19} {tags}")
    elif args.data_verb == "show":
        _print_asset(data_assets.get(ws, args.ref))
    elif args.data_verb == "archive":
        print(f"archived {data_assets.archive(ws, args.ref).ref}")
    elif args.data_verb == "verify":
        report = data_verify.verify(ws, args.ref, repair=args.repair, progress=True)
        print(json.dumps(report.as_dict(), indent=1) if args.json else report.summary())
        return 0 if report.ok else 1
    elif args.data_verb == "tune":
        from toolkit import config as config_mod
        from toolkit.data.loading_advisor import tune
        from toolkit.runs.data_pin import pin_data_asset

        cfg = config_mod.load(args.config, [f"data.asset={args.ref}", f"data.workspace={ws.root}", *(args.set or [])])
        print(tune(pin_data_asset(cfg), steps=args.steps).summary())
    elif args.data_verb == "tokenizer":
        from toolkit.data.tokenizer_training import train_tokenizer

        tokenizer = train_tokenizer(ws, args.asset, args.vocab, name=args.name, text_field=args.text_field,
                                    prompt_field=args.prompt_field, completion_field=args.completion_field,
                                    progress=sys.stderr.isatty())
        print(tokenizer.ref)
        print(f"  {tokenizer.description}; use it with --set data.tokenizer={tokenizer.ref}", file=sys.stderr)
    elif args.data_verb == "register-builtin":
        from toolkit.data.builtin import BUILTINS

        for name in BUILTINS if args.which == "all" else [args.which]:
            print(BUILTINS[name](ws).ref)
    return 0


def _cmd_runs(args) -> int:
    from toolkit.runs.run_index import list_runs

    rows = list_runs(args.workspace, data=args.data)
    print(f"{'run directory':<60} {'state':<10} {'step':>7}  {'data':<16} engine")
    for r in rows:
        step = f"{r['step']:,}" if r["step"] is not None else "-"
        print(f"{r['run_dir']:<60} {r['state']:<10} {step:>7}  {r['data']:<16} {r['engine']} x{r['nproc']}")
    return 0


def _cmd_tensorboard(args) -> int:
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


def _cmd_doctor(args) -> int:
    from toolkit.resources.doctor import facts_table, run_doctor

    def show(check):
        print(f"{check.name:<16} {check.status.upper():<5} {check.seconds:>5.1f}s  {check.summary}", flush=True)

    report = run_doctor(workspace=args.workspace, nproc=args.nproc, only=args.only, skip=args.skip, on_check=show)
    print(f"\n{facts_table(report.facts)}\n")
    sweep = next((c.details["table"] for c in report.checks if c.name == "all-reduce" and c.details), None)
    if sweep:
        print(f"{sweep}\n")
    print(report.table().splitlines()[-1])
    if args.json:
        from toolkit.fsio import atomic_write_text

        atomic_write_text(Path(args.json), json.dumps(report.to_dict(), indent=1))
    return 0 if report.ok else 1


def _cmd_estimate(args) -> int:
    from toolkit.resources.memory_estimate import estimate, model_params, parse_count, recommend_stage

    if args.config:
        from toolkit import config as config_mod

        params = model_params(config_mod.load(args.config, args.set or []))
    elif args.params:
        params = parse_count(args.params)
    else:
        raise ConfigError(refused("params", "missing", "a parameter count such as 350M, 7B or 1.3e9, or --config NAME"))
    if args.zero_stage is not None:
        print(estimate(params, args.precision, args.zero_stage, args.gpus).formula())
        return 0
    print(recommend_stage(params, args.gpu_memory, args.gpus, args.precision).summary())
    return 0


def _cmd_export(args) -> int:
    from toolkit.deploy.export import export_run

    result = export_run(args.run_dir, out=args.out)
    print(result.summary())
    if args.register is not None:
        from toolkit.catalogue.model_registry import register_model
        from toolkit.catalogue.workspace import Workspace

        model = register_model(Workspace.open(args.workspace), result.path, name=args.register or None)
        print(f"registered    {model.ref} (data {model.data}, run {model.run_dir})")
    return 0 if result.parity_ok else 1


def _cmd_models(args) -> int:
    from toolkit.catalogue.model_registry import list_models
    from toolkit.catalogue.workspace import Workspace

    print(f"{'model':<20} {'size':>10}  {'created':<19} {'data':<16} run")
    for m in list_models(Workspace.open(args.workspace)):
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.created))
        print(f"{m.ref:<20} {m.size_bytes / 2**20:>7.1f} MB  {created:<19} {m.data:<16} {m.run_dir}")
    return 0


def _cmd_serve(args) -> int:
    import shlex
    import warnings

    from toolkit.deploy.serving.endpoint import PlainHTTPWarning, serve

    with warnings.catch_warnings(record=True) as caught:  # one plain line, before any error that follows it
        warnings.simplefilter("always", PlainHTTPWarning)
        try:
            endpoint = serve(args.model, port=args.port, runtime=args.runtime, host=args.host,
                             max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, workspace=args.workspace,
                             request_timeout=args.request_timeout)
        finally:
            for warning in caught:
                print(f"warning: {warning.message}", file=sys.stderr, flush=True)
    key_file = shlex.quote(str(endpoint.folder / "key"))
    example = '{"text": "What a lovely day"}' if endpoint.tasks[0] == "classify" else '{"prompt": "def "}'
    print(f"{endpoint.describe()}\n  key file (0600): {endpoint.folder / 'key'}\n  log: {endpoint.log_path}\n"
          f"  try: curl -H \"Authorization: Bearer $(cat {key_file})\" -d '{example}' "
          + endpoint.scoring_url + "\n(Ctrl-C stops it)", flush=True)
    return _serve_until_interrupted(endpoint.stop)


def _cmd_workshop_run(args) -> int:
    from toolkit.report.workshop import main_run

    return main_run(args)


def build_parser() -> argparse.ArgumentParser:
    from toolkit.deploy.serving.protocol import REQUEST_TIMEOUT_S  # a plain module of limits: no server imported
    parser = argparse.ArgumentParser(prog="trainbook", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True)

    train = verbs.add_parser("train", help="train in the foreground with a progress bar")
    train.add_argument("config", help="a YAML file, or the name of a built-in config (tiny, demo)")
    train.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                       help="override one config field (repeatable), e.g. --set train.max_steps=50")
    train.add_argument("--run-dir", help="run directory (default: <runs-root>/<name>-<timestamp>)")
    train.add_argument("--runs-root", help="where new run directories go (default: $TRAINBOOK_RUNS or ./runs "
                       "of the project)")
    train.add_argument("--nproc", type=int, help="processes on this machine (engine.nproc)")
    train.add_argument("--engine", help="torch or deepspeed (engine.name)")
    train.add_argument("--max-restarts", type=int, default=0,
                       help="restart dead training processes from the latest checkpoint up to N times")
    train.set_defaults(func=_cmd_train)

    resume = verbs.add_parser("resume", help="continue a stopped or killed run from its latest valid checkpoint")
    resume.add_argument("run_dir")
    resume.add_argument("--max-restarts", type=int, default=0)
    resume.add_argument("--from", dest="from_checkpoint", metavar="CHECKPOINT",
                        help="roll back to this checkpoint (e.g. step_00000040); newer ones are kept aside")
    resume.set_defaults(func=_cmd_resume)

    ckpts = verbs.add_parser("checkpoints", help="list a run's checkpoints: step, size, age, valid or not")
    ckpts.add_argument("run_dir")
    ckpts.add_argument("--quick", action="store_true", help="check sizes only, not sha256")
    ckpts.set_defaults(func=_cmd_checkpoints)

    kill = verbs.add_parser("kill", help="SIGKILL a run's training processes (simulates a lost node)")
    kill.add_argument("run_dir")
    kill.set_defaults(func=_cmd_kill)

    adv = verbs.add_parser("advise", help="how often to checkpoint (Young/Daly) from a run's measured cost")
    adv.add_argument("run_dir")
    adv.add_argument("--mtbf-hours", type=float, help="mean time between failures of the whole job")
    adv.add_argument("--gpus", type=int, default=8,
                     help="GPUs in the job, for the default MTBF (Llama 3's 1 failure per ~50,700 GPU-hours)")
    adv.add_argument("--restart-seconds", type=float, default=60.0, help="time from failure to training again")
    adv.set_defaults(func=_cmd_advise)

    data = verbs.add_parser("data", help="register, list, show, verify and archive data assets in the workspace")
    data.add_argument("--workspace", help="workspace folder (default: $TRAINBOOK_WORKSPACE or ./.trainbook)")
    data_verbs = data.add_subparsers(dest="data_verb", required=True)
    reg = data_verbs.add_parser("register", help="snapshot a file or folder as the next version of NAME")
    reg.add_argument("name")
    reg.add_argument("path")
    reg.add_argument("--type", default="uri_folder", help="uri_file, uri_folder or mltable (default: uri_folder)")
    reg.add_argument("--description", default="")
    reg.add_argument("--tag", action="append", metavar="KEY=VALUE")
    lst = data_verbs.add_parser("list", help="registered versions, newest first")
    lst.add_argument("--name")
    lst.add_argument("--tag", help="KEY or KEY=VALUE")
    lst.add_argument("--all", action="store_true", help="include archived versions")
    show = data_verbs.add_parser("show", help="one version: NAME (latest) or NAME:VERSION")
    show.add_argument("ref")
    arc = data_verbs.add_parser("archive", help="hide NAME:VERSION from listings (still resolvable)")
    arc.add_argument("ref")
    verify = data_verbs.add_parser("verify", help="re-hash every blob and check each version's snapshot against "
                                   "its listing; exit 1 if anything is wrong")
    verify.add_argument("ref", nargs="?", help="NAME (every version) or NAME:VERSION (default: the whole datastore)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument("--repair", action="store_true",
                        help="rebuild snapshots whose listing and blobs are intact (e.g. made by an older Trainbook)")
    tune = data_verbs.add_parser("tune", help="measure DataLoader settings against the model's step time")
    tune.add_argument("ref", help="the data asset, NAME or NAME:VERSION")
    tune.add_argument("--config", default="demo", help="the model and batch to measure with (default: demo)")
    tune.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE")
    tune.add_argument("--steps", type=int, default=20, help="training steps timed per setting")
    builtin = data_verbs.add_parser("register-builtin", help="register the corpora that ship with Python/sklearn")
    builtin.add_argument("which", nargs="?", default="all", choices=["all", "pydoc", "stdlib", "digits"])
    tokenizer = data_verbs.add_parser("tokenizer", help="tokenizers in the workspace (data assets tagged "
                                      "kind=tokenizer)")
    tokenizer_verbs = tokenizer.add_subparsers(dest="tokenizer_verb", required=True)
    tok_train = tokenizer_verbs.add_parser("train", help="train a byte-level BPE tokenizer on a text asset and "
                                           "register it (data.tokenizer=NAME:VERSION uses it)")
    tok_train.add_argument("asset", help="the text asset, NAME or NAME:VERSION")
    tok_train.add_argument("--vocab", type=int, required=True, help="vocabulary size, 257 or more")
    tok_train.add_argument("--name", help="register it as NAME (default: ASSET-bpeVOCAB)")
    tok_train.add_argument("--text-field", default="text", help="JSON Lines files: the field with the text")
    tok_train.add_argument("--prompt-field", default="", help="JSON Lines instruction data: the prompt's field")
    tok_train.add_argument("--completion-field", default="", help="JSON Lines instruction data: the completion's")
    data.set_defaults(func=_cmd_data)

    runs = verbs.add_parser("runs", help="runs indexed in the workspace: state, step, data asset, engine")
    runs.add_argument("--workspace", help="workspace folder (default: $TRAINBOOK_WORKSPACE or ./.trainbook)")
    runs.add_argument("--data", help="only runs on this data asset (NAME or NAME:VERSION)")
    runs.set_defaults(func=_cmd_runs)

    tb = verbs.add_parser("tensorboard", help="serve a run's scalars and profiler traces on 127.0.0.1")
    tb.add_argument("run_dir")
    tb.add_argument("--port", type=int, help="port (default: a free one)")
    tb.set_defaults(func=_cmd_tensorboard)

    doctor = verbs.add_parser("doctor", help="validate this machine: versions, collectives, matmul, disk, /dev/shm, "
                              "a training step per engine; exit 0 when every required check passes")
    doctor.add_argument("--only", action="append", metavar="CHECK", help="run only this check (repeatable)")
    doctor.add_argument("--skip", action="append", metavar="CHECK", help="skip this check (repeatable)")
    doctor.add_argument("--nproc", type=int, help="processes for the all-reduce sweep (default: GPUs, at least 2)")
    doctor.add_argument("--workspace", help="workspace whose disk is checked (default: $TRAINBOOK_WORKSPACE or "
                        "./.trainbook)")
    doctor.add_argument("--json", metavar="FILE", help="also write the full report as JSON")
    doctor.set_defaults(func=_cmd_doctor)

    est = verbs.add_parser("estimate", help="model-state memory per GPU by ZeRO stage, and the stage to use")
    est.add_argument("params", nargs="?", help="parameter count: 350M, 7B, 1.3e9 (or use --config)")
    est.add_argument("--config", help="count the parameters of this config's model instead")
    est.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE")
    est.add_argument("--precision", default="bf16", help="fp16, bf16 or fp32 (default: bf16)")
    est.add_argument("--gpus", type=int, default=8, help="data-parallel GPUs (default: 8)")
    est.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU (default: 80, an A100/H100 80GB)")
    est.add_argument("--zero-stage", type=int, help="show only this stage's figure")
    est.set_defaults(func=_cmd_estimate)

    export = verbs.add_parser("export", help="RUN_DIR/model/: safetensors, ONNX and a parity report from the latest "
                              "checkpoint; --register adds it to the workspace's models")
    export.add_argument("run_dir")
    export.add_argument("--out", help="model folder (default: RUN_DIR/model)")
    export.add_argument("--register", nargs="?", const="", metavar="NAME",
                        help="register the export as NAME (default: the run's config name)")
    export.add_argument("--workspace", help="workspace (default: $TRAINBOOK_WORKSPACE or ./.trainbook)")
    export.set_defaults(func=_cmd_export)

    models = verbs.add_parser("models", help="registered models: version, size, data and run they came from")
    models.add_argument("--workspace")
    models.set_defaults(func=_cmd_models)

    serve = verbs.add_parser("serve", help="a local online endpoint (Azure ML's scoring contract) on 127.0.0.1")
    serve.add_argument("model", help="a model folder, or a registered NAME[:VERSION]")
    serve.add_argument("--port", type=int, help="port (default: a free one)")
    serve.add_argument("--runtime", help="onnx or torch (default: torch for a transformers model, which generates "
                                         "with a KV cache; onnx for the built-in models)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--max-batch", type=int, default=16, help="requests per forward pass (1: no batching)")
    serve.add_argument("--max-wait-ms", type=float, default=5.0, help="how long an idle model waits to fill a batch")
    serve.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                       help=f"seconds a request may wait for its answer before a 503 (default {REQUEST_TIMEOUT_S:g})")
    serve.add_argument("--workspace")
    serve.set_defaults(func=_cmd_serve)

    workshop = verbs.add_parser("workshop", help="run the notebooks for N participants in parallel, then compare")
    workshop_verbs = workshop.add_subparsers(dest="workshop_verb", required=True)
    wrun = workshop_verbs.add_parser("run", help="one papermill run per parameter set, as many at once as cores")
    wrun.add_argument("--participants", type=int, required=True)
    wrun.add_argument("--params", required=True, help="YAML list of parameter sets, one per participant")
    wrun.add_argument("--notebook", default="03_training", help="which notebook (default: 03_training)")
    wrun.add_argument("--parallel", type=int, help="runs at once (default: the core count)")
    wrun.add_argument("--out", help="report folder (default: outputs/workshop-<time>)")
    wrun.set_defaults(func=_cmd_workshop_run)

    from toolkit.azure.cli import add_azure_verbs

    add_azure_verbs(verbs)
    return parser


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors that mean "bad input", printed as one line; anything else is a bug and keeps its traceback."""
    from toolkit.checkpoint.store import CheckpointError
    from toolkit.catalogue.data_assets import DataAssetError
    from toolkit.runs.handle import NotThisRunError
    from toolkit.runs.run_lock import RunBusyError
    from toolkit.catalogue.workspace import WorkspaceError
    from toolkit.runs.tensorboard import TensorBoardError
    from toolkit.deploy.serving.endpoint import EndpointError

    return (ConfigError, FileExistsError, FileNotFoundError, CheckpointError, RunBusyError, NotThisRunError,
            TensorBoardError,
            DataAssetError, WorkspaceError, EndpointError, ValueError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    user_errors = _user_errors()
    try:
        return args.func(args)
    except ModuleNotFoundError as exc:  # a verb that needs an extra this install lacks (pip install . is core only)
        from toolkit.extras import missing_extra_message

        sub = getattr(args, f"{args.verb}_verb", None)  # data register, azure plan, workshop run, ...
        message = missing_extra_message(exc, f"trainbook {args.verb}" + (f" {sub}" if sub else ""))
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    except user_errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

