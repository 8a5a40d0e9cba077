"""trainbook: train, checkpoint, export and serve your models on this machine, and plan the same run for Azure ML.

One verb per job, each a thin toolkit call; `trainbook VERB --help` shows a verb's options and examples.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from toolkit.cli.conventions import VerbParser, add_verb, add_verbs
from toolkit.cli.following import Terminated, raise_terminated, start_and_follow
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
    if args.deepspeed is not None:  # as Hugging Face's --deepspeed: the file, and the engine that reads it
        # the path as a quoted string: --set values are read as YAML, where "a #b.json" or "yes" would change it
        overrides += [f"engine.name={args.engine or 'deepspeed'}",
                      f"engine.deepspeed_config={json.dumps(args.deepspeed)}"]
    if args.workspace is not None:
        overrides.append(f"data.workspace={args.workspace}")
    if args.debug:
        overrides.append("debug.enabled=true")
    cfg = config_mod.load(args.config, overrides)  # every validation error surfaces here, before any start
    if args.max_restarts < 0:
        raise ConfigError(not_allowed("--max-restarts", args.max_restarts, "0 or more", problem="is negative"))
    return start_and_follow(lambda: launch.start(cfg, run_dir=args.run_dir, runs_root=args.runs_root,
                                                  max_restarts=args.max_restarts))


def _cmd_resume(args) -> int:
    from toolkit.runs import launch

    if args.max_restarts < 0:
        raise ConfigError(not_allowed("--max-restarts", args.max_restarts, "0 or more", problem="is negative"))

    def start():
        try:
            handle = launch.resume(args.run_dir, max_restarts=args.max_restarts,
                                   from_checkpoint=args.from_checkpoint, trust_run=args.trust_run)
        except launch.NothingToResume as done:
            print(done, file=sys.stderr)
            return None
        print(handle.plan, file=sys.stderr)
        return handle

    return start_and_follow(start)


def _untrusted_notice(run_dir: str) -> dict:
    """The run's fields that resume or export would not honour without --trust-run ({} when none, or when the run
    has no readable config: the checkpoints are listed all the same)."""
    from toolkit.runs.rundir import RunDir

    try:
        return {k: v if isinstance(v, (str, int, float, bool)) else str(v)
                for k, v in RunDir(run_dir).untrusted_fields().items()}
    except (OSError, ValueError):
        return {}


def _add_trust_run(parser) -> None:
    parser.add_argument("--trust-run", action="store_true",
                        help="honour this run's config even if it came from elsewhere: the code it names "
                             "(model.factory, model.loss), the addresses (tracking.mlflow_uri, a hub id in "
                             "model.hf.source) and debug.enabled's port; read config.yaml first")


def _cmd_scale(args) -> int:
    from toolkit.fsio import atomic_write_text
    from toolkit.runs import scaling

    overrides = list(args.set or []) + ([f"engine.name={args.engine}"] if args.engine else [])
    counts = scaling.parse_counts(args.nproc) if args.nproc is not None else None
    plan = scaling.plan(args.config, overrides, counts, mode=args.mode, steps=args.steps, out=args.out,
                        runs_root=args.runs_root, side_by_side=args.side_by_side)  # refusals: before any run
    # the runs live in their own sessions: a SIGTERM or a closed terminal must stop them too (run_series does)
    previous = {sig: signal.signal(sig, raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        result = scaling.run_series(plan, on_line=lambda line: print(line, file=sys.stderr, flush=True))
    except scaling.ScalingError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, Terminated) as exc:
        signum = exc.args[0] if isinstance(exc, Terminated) else signal.SIGINT
        print(f"interrupted ({signal.Signals(signum).name}): the series' runs were stopped", file=sys.stderr)
        return 128 + signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    out = Path(result.out)
    try:
        from toolkit.report.plots import scaling as scaling_picture

        result.picture = str(scaling_picture(result.to_dict(), out / "scaling.png"))
    except ModuleNotFoundError as exc:  # a core install: the table and the JSON still stand
        from toolkit.extras import missing_extra_message

        print(f"no picture: {missing_extra_message(exc, 'the picture') or exc}", file=sys.stderr)
    document = result.to_dict()
    atomic_write_text(out / "scaling.json", json.dumps(document, indent=1) + "\n")
    if args.json:
        _print_json(document)
    else:
        print(result.table())
        print(f"picture: {result.picture}\nresults: {out / 'scaling.json'}")
    return 0


def _cmd_checkpoints(args) -> int:
    from toolkit.checkpoint.store import CheckpointStore

    if not Path(args.run_dir).is_dir():
        raise FileNotFoundError(not_allowed("run_dir", args.run_dir, "a run directory", problem="is not a folder"))
    store = CheckpointStore(args.run_dir)
    infos = store.list(verify=not args.quick)
    untrusted = _untrusted_notice(args.run_dir)
    latest = store.latest_name()
    if args.json:
        _print_json({"run_dir": str(store.root), "latest": latest, "checkpoints": [
            {"name": i.name, "step": i.step, "size_bytes": i.size_bytes, "created": i.created, "valid": i.valid,
             "reason": i.reason or None} for i in infos], "untrusted_fields": untrusted})
        return 0
    if untrusted:
        from toolkit.runs.trust import FLAG, describe

        print(f"note: not your run's settings (resume needs {FLAG}): {describe(untrusted)}", file=sys.stderr)
    if not infos:
        print(f"no checkpoints in {store.root}")
        return 0
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


def _print_json(document) -> None:
    """One JSON document on stdout: the shapes are documented in the README ("For scripts")."""
    print(json.dumps(document, indent=1, default=str))


def _asset_json(asset) -> dict:
    import dataclasses

    fields = dataclasses.asdict(asset)
    fields.pop("listing", None)  # every file's hash: `data verify` is the verb that reads them
    return {"ref": asset.ref, **fields}


def _listing_json(ws, key: str, items: list) -> dict:
    """A listing's JSON document: the workspace it read (None: there is none yet) and its items."""
    return {"workspace": str(ws.root) if ws else None, key: items}


def _workspace_path(ws, path) -> Path:
    """Where the workspace is (``ws``, opened) or would be (None: the folder --workspace or the default names)."""
    from toolkit.catalogue.workspace import default_path

    return ws.root if ws else Path(path or default_path()).resolve()


def _workspace_line(ws, path) -> str:
    return f"workspace: {_workspace_path(ws, path)}" + ("" if ws else " (none yet)")


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

    if args.data_verb in ("list", "show"):  # looking never creates a workspace
        ws = Workspace.existing(args.workspace)
        if args.data_verb == "show":
            if ws is None:
                raise data_assets.DataAssetError(not_allowed(
                    "ref", args.ref, "a registered asset", problem=f"is unknown: there is no workspace at "
                    f"{_workspace_path(ws, args.workspace)} yet; register data first"))
            asset = data_assets.get(ws, args.ref)
            _print_json(_asset_json(asset)) if args.json else _print_asset(asset)
            return 0
        assets = data_assets.list_assets(ws, name=args.name, include_archived=args.all, tag=args.tag) if ws else []
        if args.json:
            _print_json(_listing_json(ws, "assets", [_asset_json(a) for a in assets]))
            return 0
        print(_workspace_line(ws, args.workspace))
        if not assets:
            print("no data assets" + (" match" if ws and (args.name or args.tag) else "")
                  + ": try `trainbook data register-builtin`, or `trainbook data register NAME PATH`")
            return 0
        print(f"{'asset':<28} {'type':<11} {'size':>12} {'files':>6}  {'created':<19} tags")
        for a in assets:
            created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.created))
            tags = ",".join(f"{k}={v}" for k, v in sorted(a.tags.items()))
            print(f"{a.ref + (' (archived)' if a.archived else ''):<28} {a.type:<11} {a.size_bytes:>12,} "
                  f"{a.file_count:>6}  {created:<19} {tags}")
        return 0
    ws = Workspace.open(args.workspace)
    if args.data_verb == "register":
        asset = data_assets.register(ws, args.name, args.path, type=args.type, description=args.description,
                                     tags=_parse_tags(args.tag))
        print(asset.ref)
        if args.type is None:
            print(f"  type {asset.type} (from the path; --type sets it)", file=sys.stderr)
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
    from toolkit.catalogue.workspace import Workspace
    from toolkit.runs.run_index import list_runs

    ws = Workspace.existing(args.workspace)
    rows = list_runs(ws.root, data=args.data) if ws else []
    if args.json:
        _print_json(_listing_json(ws, "runs", rows))
        return 0
    print(_workspace_line(ws, args.workspace))
    if not rows:
        print("no runs" + (f" on {args.data}" if args.data and ws else "") + ": try `trainbook train demo`")
        return 0
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
    from toolkit import config as config_mod
    from toolkit.resources import memory_estimate as me

    overrides = list(args.set or [])
    if args.nproc is not None:
        overrides.append(f"engine.nproc={args.nproc}")
    if args.engine is not None:
        overrides.append(f"engine.name={args.engine}")
    if overrides and not args.config:
        raise ConfigError(refused("--set/--nproc/--engine", "given without --config", "--config NAME with them"))
    if args.run and (args.config or args.params):
        raise ConfigError(not_allowed("--run", args.run, "--run alone (the run's own config is what it measured)",
                                      problem="is given together with " + ("--config" if args.config else "a count")))
    cfg = config_mod.load(args.config, overrides) if args.config else None
    if cfg is not None and args.zero_stage is not None and cfg.engine.name == "deepspeed":
        cfg = config_mod.load(args.config, [*overrides, f"engine.zero_stage={args.zero_stage}"])
    if args.measure_baseline:
        from toolkit.runs.rundir import RunDir

        engines = [cfg.engine.name] if cfg else [RunDir(args.run).read_config().engine.name] if args.run else \
            list(me.REFERENCE_BASELINE_MIB)
        for engine in engines:
            print(f"measuring the {engine} baseline: the tiny config for {me.BASELINE_STEPS} steps on 2 processes...",
                  flush=True)
            peaks = me.measure_baseline(engine)
            print(f"  {engine}: {', '.join(f'rank {r} {p:,.0f} MiB' for r, p in enumerate(peaks))} (kept in "
                  f"{me.baseline_cache_path()})")
    if args.run:
        comparison = me.compare_run(args.run, device=args.device)
        print(comparison.prediction.table())
        print(comparison.table())
        return 0
    if cfg is not None:
        prediction = me.predict_run(cfg, device=args.device)
        params, precision = prediction.params, args.precision or cfg.engine.precision
        print(f"model: {params:,.0f} parameters ({params / 1e9:.3g}B)")
        print(prediction.table())
        print(f"\non GPUs: model state per GPU by ZeRO stage ({precision}, {args.gpus} GPUs):")
    elif args.params:
        params, precision = me.parse_count(args.params), args.precision or "bf16"
        print(f"model: {params:,.0f} parameters ({params / 1e9:.3g}B)")
    else:
        raise ConfigError(refused("params", "missing", "a parameter count such as 350M, 7B or 1.3e9, --config NAME "
                                  "or --run RUN_DIR"))
    if args.zero_stage is not None:
        print(me.estimate(params, precision, args.zero_stage, args.gpus).formula())
    else:
        print(me.recommend_stage(params, args.gpu_memory, args.gpus, precision).summary())
    if args.write_config:
        written = me.write_recommended_config(args.write_config, params=None if cfg else params, base=args.config,
                                              overrides=overrides, gpus=args.gpus, gpu_memory_gib=args.gpu_memory,
                                              precision=precision)
        print(f"\n{written.summary()}")
    return 0


def _cmd_export(args) -> int:
    if args.register:  # checked before an export that takes seconds, not after it
        from toolkit.names import check_name

        check_name(args.register, "--register")
    from toolkit.deploy.export import export_run

    result = export_run(args.run_dir, out=args.out, trust_run=args.trust_run)
    model = None
    if args.register is not None:
        from toolkit.catalogue.model_registry import register_model
        from toolkit.catalogue.workspace import Workspace

        model = register_model(Workspace.open(args.workspace), result.path, name=args.register or None)
    if args.json:
        _print_json({"path": str(result.path), "parity_ok": result.parity_ok, "parity": result.parity,
                     "manifest": result.manifest, "registered": model.ref if model else None})
    else:
        print(result.summary())
        if model:
            print(f"registered    {model.ref} (data {model.data}, run {model.run_dir})")
    return 0 if result.parity_ok else 1


def _cmd_models(args) -> int:
    from toolkit.catalogue.model_registry import list_models
    from toolkit.catalogue.workspace import Workspace

    import dataclasses

    ws = Workspace.existing(args.workspace)
    models = list_models(ws) if ws else []
    if args.json:
        _print_json(_listing_json(ws, "models", [{"ref": m.ref, **dataclasses.asdict(m)} for m in models]))
        return 0
    print(_workspace_line(ws, args.workspace))
    if not models:
        print("no models: try `trainbook export RUN_DIR --register NAME`")
        return 0
    print(f"{'model':<20} {'size':>10}  {'created':<19} {'data':<16} run")
    for m in models:
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
    if endpoint.key_file.note:
        print(f"note: {endpoint.key_file.note}", file=sys.stderr, flush=True)
    print(f"{endpoint.describe()}\n  key file ({endpoint.key_file.mode_text}): {endpoint.key_file.path}\n"
          f"  log: {endpoint.log_path}\n"
          f"  try: curl -H \"Authorization: Bearer $(cat {key_file})\" -d '{example}' "
          + endpoint.scoring_url + f"\n(Ctrl-C or `trainbook endpoints stop {endpoint.name}` stops it)", flush=True)
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
    print(f"endpoint {endpoint.name} stopped" + (f" (exit code {code}; log: {endpoint.log_path})" if code else ""),
          file=sys.stderr)
    return 0 if code == 0 else 1


def _cmd_stop(args) -> int:
    from toolkit.cli.lifecycle import cmd_stop

    return cmd_stop(args)


def _cmd_watch(args) -> int:
    from toolkit.cli.lifecycle import cmd_watch

    return cmd_watch(args)


def _cmd_endpoints(args) -> int:
    from toolkit.cli.lifecycle import cmd_endpoints

    return cmd_endpoints(args)


def _cmd_config_show(args) -> int:
    from toolkit import config as config_mod

    print(config_mod.commented_yaml(config_mod.load(args.config, args.set or [])), end="")
    return 0


def _cmd_completion(args) -> int:
    from toolkit.cli.completion import bash_script

    print(bash_script(build_parser()), end="")
    return 0


def _cmd_workshop_run(args) -> int:
    from toolkit.report.workshop import main_run

    return main_run(args)


def _add_workspace(parser, *, below_group: bool = False) -> None:
    """--workspace on a verb that reads or writes the workspace. ``below_group``: a sub-verb of a group that takes
    it too (``data --workspace W list`` and ``data list --workspace W`` both work; the later one wins)."""
    parser.add_argument("--workspace", metavar="FOLDER", default=argparse.SUPPRESS if below_group else None,
                        help="workspace folder (default: $TRAINBOOK_WORKSPACE or ./.trainbook)")


def _add_json(parser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON (shapes: README, 'For scripts')")


def _version() -> str:
    from importlib import metadata

    try:
        version = metadata.version("trainbook")
    except metadata.PackageNotFoundError:  # a checkout run without pip install
        version = "unknown (not installed)"
    return f"trainbook {version} (python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    from toolkit.deploy.serving.protocol import REQUEST_TIMEOUT_S  # a plain module of limits: no server imported
    from toolkit.resources.doctor import CHECKS  # check functions import their tools when they run
    from toolkit.runs.handle import STOP_WAIT_S  # imports no torch
    from toolkit.config import EngineConfig, field_choices
    from toolkit.deploy.serving.options import WEIGHTS  # runtime -> the weights file it loads

    parser = VerbParser(prog="trainbook", description=__doc__, examples=[
        "trainbook data register-builtin", "trainbook train demo", "trainbook runs", "trainbook train --help"])
    parser.add_argument("--version", action="version", version=_version())
    verbs = add_verbs(parser, "verb")
    S = "SECTION.FIELD=VALUE"

    train = add_verb(verbs, "train", "train in the foreground with a progress bar", [
        "trainbook train demo",
        "trainbook train tiny --nproc 2 --engine deepspeed --set train.max_steps=50",
        "trainbook train demo --nproc 2 --deepspeed ds_config.json --set train.grad_accum_steps=4",
        "trainbook train my_config.yaml --set data.asset=mycorpus:2 --max-restarts 3",
        "trainbook train tiny --debug --set debug.port=5678"])
    train.add_argument("config", help="a YAML file, or the name of a built-in config (tiny, demo, llama, digits, ...)")
    train.add_argument("--set", action="append", metavar=S,
                       help="override one config field (repeatable), e.g. --set train.max_steps=50")
    train.add_argument("--run-dir", help="run directory (default: <runs-root>/<name>-<timestamp>)")
    train.add_argument("--runs-root", help="where new run directories go (default: $TRAINBOOK_RUNS or ./runs "
                       "of the project)")
    train.add_argument("--nproc", type=int, help="processes on this machine (engine.nproc)")
    train.add_argument("--engine", choices=field_choices(EngineConfig, "name"), help="the training engine (engine.name)")
    train.add_argument("--deepspeed", metavar="DS_CONFIG", help="your DeepSpeed config, JSON or YAML ('auto' values "
                       "filled from the config; engine.deepspeed_config, and --engine deepspeed)")
    train.add_argument("--max-restarts", type=int, default=0,
                       help="restart dead training processes from the latest checkpoint up to N times")
    train.add_argument("--debug", action="store_true",
                       help="start debugpy in rank 0 on 127.0.0.1 and wait for a debugger (VS Code) before training, "
                            "on every restart too (debug.enabled; the port: debug.port, 0 a free one)")
    _add_workspace(train)
    train.set_defaults(func=_cmd_train)

    resume = add_verb(verbs, "resume", "continue a stopped or killed run from its latest valid checkpoint", [
        "trainbook resume runs/demo-20261125-101500", "trainbook resume RUN_DIR --from step_00000040"])
    resume.add_argument("run_dir", help="the run directory to continue")
    resume.add_argument("--max-restarts", type=int, default=0,
                        help="restart dead training processes from the latest checkpoint up to N times")
    resume.add_argument("--from", dest="from_checkpoint", metavar="CHECKPOINT",
                        help="roll back to this checkpoint (e.g. step_00000040); newer ones are kept aside")
    _add_trust_run(resume)
    resume.set_defaults(func=_cmd_resume)

    stop = add_verb(verbs, "stop", "stop a running run: it saves a checkpoint, then exits (resume continues it)", [
        "trainbook stop runs/demo-20261125-101500"])
    stop.add_argument("run_dir", help="the run directory of a running run")
    stop.add_argument("--timeout", type=float, default=STOP_WAIT_S,
                      help=f"seconds to wait for the checkpoint before the run is killed (default: {STOP_WAIT_S:g})")
    stop.set_defaults(func=_cmd_stop)

    watch = add_verb(verbs, "watch", "follow a run started elsewhere: its progress bar until it ends (Ctrl-C "
                     "leaves it running)", ["trainbook watch runs/demo-20261125-101500"])
    watch.add_argument("run_dir", help="the run directory to follow")
    watch.set_defaults(func=_cmd_watch)

    kill = add_verb(verbs, "kill", "SIGKILL a run's training processes (simulates a lost node)", [
        "trainbook kill RUN_DIR && trainbook resume RUN_DIR"])
    kill.add_argument("run_dir", help="the run directory of a running run")
    kill.set_defaults(func=_cmd_kill)

    ckpts = add_verb(verbs, "checkpoints", "list a run's checkpoints: step, size, age, valid or not", [
        "trainbook checkpoints RUN_DIR", "trainbook checkpoints RUN_DIR --quick --json"])
    ckpts.add_argument("run_dir", help="the run directory")
    ckpts.add_argument("--quick", action="store_true", help="check sizes only, not sha256")
    _add_json(ckpts, "the checkpoints")
    ckpts.set_defaults(func=_cmd_checkpoints)

    adv = add_verb(verbs, "advise", "how often to checkpoint (Young/Daly) from a run's measured cost", [
        "trainbook advise RUN_DIR --gpus 64"])
    adv.add_argument("run_dir", help="a run that has saved at least one checkpoint")
    adv.add_argument("--mtbf-hours", type=float, help="mean time between failures of the whole job")
    adv.add_argument("--gpus", type=int, default=8,
                     help="GPUs in the job, for the default MTBF (Llama 3's 1 failure per ~50,700 GPU-hours)")
    adv.add_argument("--restart-seconds", type=float, default=60.0, help="time from failure to training again")
    adv.set_defaults(func=_cmd_advise)

    _add_data_verbs(verbs)

    runs = add_verb(verbs, "runs", "runs indexed in the workspace: state, step, data asset, engine", [
        "trainbook runs", "trainbook runs --data pydoc --json"])
    runs.add_argument("--data", help="only runs on this data asset (NAME or NAME:VERSION)")
    _add_workspace(runs)
    _add_json(runs, "the runs")
    runs.set_defaults(func=_cmd_runs)

    tb = add_verb(verbs, "tensorboard", "serve a run's scalars and profiler traces on 127.0.0.1", [
        "trainbook tensorboard RUN_DIR", "trainbook tensorboard RUN_DIR --port 6006"])
    tb.add_argument("run_dir", help="the run directory")
    tb.add_argument("--port", type=int, help="port (default: a free one)")
    tb.set_defaults(func=_cmd_tensorboard)

    doctor = add_verb(verbs, "doctor", "validate this machine: versions, collectives, matmul, disk, /dev/shm, a "
                      "training step per engine; exit 0 when every required check passes", [
                          "trainbook doctor", "trainbook doctor --only matmul --only disk",
                          "trainbook doctor --skip all-reduce --json report.json"])
    doctor.add_argument("--only", action="append", metavar="CHECK", choices=list(CHECKS),
                        help=f"run only this check (repeatable): {', '.join(CHECKS)}")
    doctor.add_argument("--skip", action="append", metavar="CHECK", choices=list(CHECKS),
                        help="skip this check (repeatable)")
    doctor.add_argument("--nproc", type=int, help="processes for the all-reduce sweep (default: GPUs, at least 2)")
    _add_workspace(doctor)
    doctor.add_argument("--json", metavar="FILE", help="also write the full report as JSON")
    doctor.set_defaults(func=_cmd_doctor)

    est = add_verb(verbs, "estimate", "peak memory per rank of a run (predicted, or against a finished run's "
                   "measurement), model state per GPU by ZeRO stage, and the recommended setting as a config", [
                       "trainbook estimate 7B --gpus 8 --gpu-memory 80",
                       "trainbook estimate --config tiny --nproc 2 --engine deepspeed --zero-stage 2",
                       "trainbook estimate --run runs/tiny-20261126-101500",
                       "trainbook estimate 7B --gpus 8 --gpu-memory 80 --write-config zero.yaml",
                       "trainbook estimate --config demo --gpus 2 --write-config demo-zero.yaml"])
    est.add_argument("params", nargs="?", help="parameter count with its unit: 350M, 7B, 1.3e9 (or use --config)")
    est.add_argument("--config", help="predict this config's run: peak memory per rank on this machine")
    est.add_argument("--set", action="append", metavar=S, help="override one field of --config (repeatable)")
    est.add_argument("--nproc", type=int, help="processes for --config's run (engine.nproc)")
    est.add_argument("--engine", choices=field_choices(EngineConfig, "name"), help="engine for --config's run "
                     "(engine.name)")
    est.add_argument("--device", choices=["cpu", "cuda"], help="predict for this device (default: this machine's)")
    est.add_argument("--run", metavar="RUN_DIR", help="compare a run's measured peak per rank (its last train "
                     "event) with the prediction for its own config")
    est.add_argument("--measure-baseline", action="store_true", help="first measure this machine's baseline (the "
                     "tiny config's peak, ~30 s per engine) and keep it for later predictions")
    est.add_argument("--write-config", metavar="FILE.yaml", help="write the recommended setting (ZeRO stage, "
                     "processes, precision; offload when no stage fits) as a config that trains")
    est.add_argument("--precision", choices=["fp16", "bf16", "fp32"], help="for the GPU figures (default: "
                     "--config's engine.precision, else bf16)")
    est.add_argument("--gpus", type=int, default=8, help="data-parallel GPUs (default: 8)")
    est.add_argument("--gpu-memory", type=float, default=80.0, help="GiB per GPU (default: 80, an A100/H100 80GB)")
    est.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], help="show only this stage's GPU figure (and, "
                     "with --config on the deepspeed engine, predict that stage)")
    est.set_defaults(func=_cmd_estimate)

    scale = add_verb(verbs, "scale", "train briefly at 1, 2, 4... processes: tokens/s, efficiency vs linear, and "
                     "a step's time as compute, communication and data wait", [
                         "trainbook scale tiny --nproc 1,2", "trainbook scale demo --nproc 1,2 --strong --steps 40",
                         "trainbook scale demo --nproc 1,2,4,8 --engine deepspeed --set engine.zero_stage=2 --json"])
    scale.add_argument("config", help="a YAML file, or the name of a built-in config (tiny, demo, llama, ...)")
    scale.add_argument("--nproc", metavar="N,N,...", help="process counts, e.g. 1,2,4 (1, the baseline, is always "
                       "run; default: 1, 2, 4... up to one per GPU, or per usable core)")
    mode = scale.add_mutually_exclusive_group()
    mode.add_argument("--weak", dest="mode", action="store_const", const="weak",
                      help="train.batch_size per process, the global batch grows with N (the default)")
    mode.add_argument("--strong", dest="mode", action="store_const", const="strong",
                      help="train.batch_size is the global batch, split over the N processes")
    scale.set_defaults(mode="weak")
    scale.add_argument("--steps", type=int, default=20, help="measured steps per run, after a warm-up (default: 20)")
    scale.add_argument("--set", action="append", metavar=S, help="override one config field (repeatable)")
    scale.add_argument("--engine", choices=field_choices(EngineConfig, "name"),
                       help="the training engine (engine.name)")
    scale.add_argument("--side-by-side", action="store_true", help="also run N independent 1-process runs at once "
                       "for each N > 1: what the machine does for trials that need no communication")
    scale.add_argument("--out", help="the series folder: its run directories, scaling.png and scaling.json "
                       "(default: <runs-root>/<name>-scale-<timestamp>)")
    scale.add_argument("--runs-root", help="where a new series folder goes (default: $TRAINBOOK_RUNS or ./runs of the "
                       "project)")
    _add_json(scale, "the table")
    scale.set_defaults(func=_cmd_scale)

    export = add_verb(verbs, "export", "RUN_DIR/model/: safetensors, ONNX and a parity report from the latest "
                      "checkpoint; --register adds it to the workspace's models", [
                          "trainbook export RUN_DIR", "trainbook export RUN_DIR --register demo"])
    export.add_argument("run_dir", help="a run with at least one valid checkpoint")
    export.add_argument("--out", help="model folder (default: RUN_DIR/model)")
    _add_trust_run(export)
    export.add_argument("--register", nargs="?", const="", metavar="NAME",
                        help="register the export as NAME (default: the run's config name)")
    _add_workspace(export)
    _add_json(export, "the export's summary")
    export.set_defaults(func=_cmd_export)

    models = add_verb(verbs, "models", "registered models: version, size, data and run they came from", [
        "trainbook models", "trainbook models --json"])
    _add_workspace(models)
    _add_json(models, "the models")
    models.set_defaults(func=_cmd_models)

    serve = add_verb(verbs, "serve", "a local online endpoint (Azure ML's scoring contract) on 127.0.0.1", [
        "trainbook serve demo", "trainbook serve RUN_DIR/model --runtime torch --port 8081 &"])
    serve.add_argument("model", help="a model folder, or a registered NAME[:VERSION]")
    serve.add_argument("--port", type=int, help="port (default: a free one)")
    serve.add_argument("--runtime", choices=list(WEIGHTS), help="default: torch for a transformers model, which "
                       "generates with a KV cache; onnx for the built-in models")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--max-batch", type=int, default=16, help="requests per forward pass (1: no batching)")
    serve.add_argument("--max-wait-ms", type=float, default=5.0, help="how long an idle model waits to fill a batch")
    serve.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S,
                       help=f"seconds a request may wait for its answer before a 503 (default {REQUEST_TIMEOUT_S:g})")
    _add_workspace(serve)
    serve.set_defaults(func=_cmd_serve)

    endpoints = add_verb(verbs, "endpoints", "local endpoints that are running: model, URL, pid, key file", [
        "trainbook endpoints", "trainbook endpoints stop demo"])
    _add_workspace(endpoints)
    _add_json(endpoints, "the running endpoints")
    endpoint_verbs = add_verbs(endpoints, "endpoints_verb", required=False)
    estop = add_verb(endpoint_verbs, "stop", "stop a running endpoint by name", ["trainbook endpoints stop demo"])
    estop.add_argument("name", help="the endpoint's name (the first column of `trainbook endpoints`)")
    _add_workspace(estop, below_group=True)
    endpoints.set_defaults(func=_cmd_endpoints)

    config = add_verb(verbs, "config", "built-in and your own configs: show one resolved, with each field's doc", [
        "trainbook config show demo", "trainbook config show llama --set train.batch_size=8"])
    config_verbs = add_verbs(config, "config_verb")
    cshow = add_verb(config_verbs, "show", "the resolved config (built-in defaults, the file, then --set), each "
                     "field with its value and doc", ["trainbook config show demo --set engine.nproc=2"])
    cshow.add_argument("config", help="a YAML file, or the name of a built-in config")
    cshow.add_argument("--set", action="append", metavar=S, help="override one config field (repeatable)")
    cshow.set_defaults(func=_cmd_config_show)

    completion = add_verb(verbs, "completion", "print a shell completion script for trainbook", [
        'trainbook completion bash >> ~/.bashrc'])
    completion.add_argument("shell", choices=["bash"], help="bash (zsh: `autoload bashcompinit && bashcompinit` "
                            "first)")
    completion.set_defaults(func=_cmd_completion)

    workshop = add_verb(verbs, "workshop", "run the notebooks for N participants in parallel, then compare", [
        "trainbook workshop run --participants 4 --params sets.yaml"])
    workshop_verbs = add_verbs(workshop, "workshop_verb")
    wrun = add_verb(workshop_verbs, "run", "one papermill run per parameter set, as many at once as cores", [
        "trainbook workshop run --participants 4 --params sets.yaml --notebook 03_training"])
    wrun.add_argument("--participants", type=int, required=True, help="how many parameter sets to run")
    wrun.add_argument("--params", required=True, help="YAML list of parameter sets, one per participant")
    wrun.add_argument("--notebook", default="03_training", help="which notebook (default: 03_training)")
    wrun.add_argument("--parallel", type=int, help="runs at once (default: the core count)")
    wrun.add_argument("--out", help="report folder (default: outputs/workshop-<time>)")
    wrun.set_defaults(func=_cmd_workshop_run)

    from toolkit.azure.cli import add_azure_verbs

    add_azure_verbs(verbs)
    return parser


def _add_data_verbs(verbs) -> None:
    from toolkit.catalogue.data_assets import TYPES

    data = add_verb(verbs, "data", "register, list, show, verify and archive data assets in the workspace", [
        "trainbook data register-builtin", "trainbook data register mycorpus ./texts/",
        "trainbook data list --json"])
    _add_workspace(data)
    data_verbs = add_verbs(data, "data_verb")

    def data_verb(name, help, examples):
        verb = add_verb(data_verbs, name, help, examples)
        _add_workspace(verb, below_group=True)
        return verb

    reg = data_verb("register", "snapshot a file or folder as the next version of NAME", [
        "trainbook data register mycorpus ./texts/", "trainbook data register notes notes.jsonl --type uri_file"])
    reg.add_argument("name", help="the asset's name: letters, digits, '-', '_', '.'")
    reg.add_argument("path", help="the file or folder to snapshot")
    reg.add_argument("--type", choices=TYPES, help="uri_file for a file, uri_folder for a folder, mltable for a "
                     "folder with an MLTable file (default: from PATH)")
    reg.add_argument("--description", default="", help="one line about the data")
    reg.add_argument("--tag", action="append", metavar="KEY=VALUE", help="a tag (repeatable)")
    lst = data_verb("list", "registered versions, newest first", ["trainbook data list --name pydoc --all"])
    lst.add_argument("--name", help="only this asset's versions")
    lst.add_argument("--tag", help="only versions with this tag: KEY or KEY=VALUE")
    lst.add_argument("--all", action="store_true", help="include archived versions")
    _add_json(lst, "the versions")
    show = data_verb("show", "one version: NAME (latest) or NAME:VERSION", ["trainbook data show pydoc:1"])
    show.add_argument("ref", help="NAME (the latest version) or NAME:VERSION")
    _add_json(show, "the version")
    arc = data_verb("archive", "hide NAME:VERSION from listings (still resolvable)", ["trainbook data archive pydoc:1"])
    arc.add_argument("ref", help="NAME:VERSION")
    verify = data_verb("verify", "re-hash every blob and check each version's snapshot against its listing; exit 1 "
                       "if anything is wrong", ["trainbook data verify", "trainbook data verify pydoc:1 --json"])
    verify.add_argument("ref", nargs="?", help="NAME (every version) or NAME:VERSION (default: the whole datastore)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument("--repair", action="store_true",
                        help="restore damaged blobs from their sources where those still hold the registered "
                        "bytes (hash-checked), then rebuild snapshots whose listing and blobs are intact")
    tune = data_verb("tune", "measure DataLoader settings against the model's step time", [
        "trainbook data tune pydoc --config demo --steps 10"])
    tune.add_argument("ref", help="the data asset, NAME or NAME:VERSION")
    tune.add_argument("--config", default="demo", help="the model and batch to measure with (default: demo)")
    tune.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", help="override one config field")
    tune.add_argument("--steps", type=int, default=20, help="training steps timed per setting")
    builtin = data_verb("register-builtin", "register the corpora that ship with Python/sklearn", [
        "trainbook data register-builtin", "trainbook data register-builtin stdlib"])
    builtin.add_argument("which", nargs="?", default="all", choices=["all", "pydoc", "stdlib", "digits"],
                         help="which corpus (default: all)")
    tokenizer = data_verb("tokenizer", "tokenizers in the workspace (data assets tagged kind=tokenizer)", [
        "trainbook data tokenizer train pydoc --vocab 2048"])
    tokenizer_verbs = add_verbs(tokenizer, "tokenizer_verb")
    tok_train = add_verb(tokenizer_verbs, "train", "train a byte-level BPE tokenizer on a text asset and register it "
                         "(data.tokenizer=NAME:VERSION uses it)", ["trainbook data tokenizer train pydoc --vocab 2048"])
    _add_workspace(tok_train, below_group=True)
    tok_train.add_argument("asset", help="the text asset, NAME or NAME:VERSION")
    tok_train.add_argument("--vocab", type=int, required=True, help="vocabulary size, 257 or more")
    tok_train.add_argument("--name", help="register it as NAME (default: ASSET-bpeVOCAB)")
    tok_train.add_argument("--text-field", default="text", help="JSON Lines files: the field with the text")
    tok_train.add_argument("--prompt-field", default="", help="JSON Lines instruction data: the prompt's field")
    tok_train.add_argument("--completion-field", default="", help="JSON Lines instruction data: the completion's")
    data.set_defaults(func=_cmd_data)


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

