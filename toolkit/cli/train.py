"""``trainbook train``: train in the foreground with a progress bar."""

from __future__ import annotations


from toolkit.cli.common import add_max_restarts, add_set, add_workspace, check_max_restarts, config_overrides
from toolkit.cli.conventions import add_verb
from toolkit.cli.following import start_and_follow


def register(verbs) -> None:
    from toolkit.config import EngineConfig, field_choices

    train = add_verb(
        verbs,
        "train",
        "train in the foreground with a progress bar",
        [
            "trainbook train demo",
            "trainbook train tiny --nproc 2 --engine deepspeed --set train.max_steps=50",
            "trainbook train demo --nproc 2 --deepspeed ds_config.json --set train.grad_accum_steps=4",
            "trainbook train my_config.yaml --set data.asset=mycorpus:2 --max-restarts 3",
            "trainbook train tiny --debug --set debug.port=5678",
        ],
    )
    train.add_argument("config", help="a YAML file, or the name of a built-in config (tiny, demo, llama, digits, ...)")
    add_set(train, "override one config field (repeatable), e.g. --set train.max_steps=50")
    train.add_argument("--run-dir", help="run directory (default: <runs-root>/<name>-<timestamp>)")
    train.add_argument(
        "--runs-root", help="where new run directories go (default: $TRAINBOOK_RUNS or ./runs of the project)"
    )
    train.add_argument("--nproc", type=int, help="processes on this machine (engine.nproc)")
    train.add_argument(
        "--engine", choices=field_choices(EngineConfig, "name"), help="the training engine (engine.name)"
    )
    train.add_argument(
        "--deepspeed",
        metavar="DS_CONFIG",
        help="your DeepSpeed config, JSON or YAML ('auto' values "
        "filled from the config; engine.deepspeed_config, and --engine deepspeed)",
    )
    add_max_restarts(train)
    train.add_argument(
        "--debug",
        action="store_true",
        help="start debugpy in rank 0 on 127.0.0.1 and wait for a debugger (VS Code) before training, "
        "on every restart too (debug.enabled; the port: debug.port, 0 a free one)",
    )
    add_workspace(train)
    train.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from toolkit import config as config_mod
    from toolkit.runs import launch

    overrides = config_overrides(args.set, nproc=args.nproc, engine=args.engine)
    if args.deepspeed is not None:  # as Hugging Face's --deepspeed: the file, and the engine that reads it
        # the path as a quoted string: --set values are read as YAML, where "a #b.json" or "yes" would change it
        overrides += [
            f"engine.name={args.engine or 'deepspeed'}",
            config_mod.string_override("engine.deepspeed_config", args.deepspeed),
        ]
    if args.workspace is not None:
        overrides.append(config_mod.string_override("data.workspace", args.workspace))
    if args.debug:
        overrides.append("debug.enabled=true")
    cfg = config_mod.load(args.config, overrides)  # every validation error surfaces here, before any start
    check_max_restarts(args.max_restarts)
    return start_and_follow(
        lambda: launch.start(cfg, run_dir=args.run_dir, runs_root=args.runs_root, max_restarts=args.max_restarts)
    )
