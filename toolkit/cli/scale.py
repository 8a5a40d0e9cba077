"""``trainbook scale``: train briefly at 1, 2, 4... processes: tokens/s, efficiency vs linear, and a step's time as
compute, communication and data wait."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

from toolkit.cli.common import add_json, add_set, config_overrides, print_json
from toolkit.cli.conventions import add_verb
from toolkit.cli.following import Terminated, raise_terminated


def register(verbs) -> None:
    from toolkit.config import EngineConfig, field_choices

    scale = add_verb(
        verbs,
        "scale",
        "train briefly at 1, 2, 4... processes: tokens/s, efficiency vs linear, and "
        "a step's time as compute, communication and data wait",
        [
            "trainbook scale tiny --nproc 1,2",
            "trainbook scale demo --nproc 1,2 --strong --steps 40",
            "trainbook scale demo --nproc 1,2,4,8 --engine deepspeed --set engine.zero_stage=2 --json",
        ],
    )
    scale.add_argument("config", help="a YAML file, or the name of a built-in config (tiny, demo, llama, ...)")
    scale.add_argument(
        "--nproc",
        metavar="N,N,...",
        help="process counts, e.g. 1,2,4 (1, the baseline, is always "
        "run; default: 1, 2, 4... up to one per GPU, or per usable core)",
    )
    mode = scale.add_mutually_exclusive_group()
    mode.add_argument(
        "--weak",
        dest="mode",
        action="store_const",
        const="weak",
        help="train.batch_size per process, the global batch grows with N (the default)",
    )
    mode.add_argument(
        "--strong",
        dest="mode",
        action="store_const",
        const="strong",
        help="train.batch_size is the global batch, split over the N processes",
    )
    scale.set_defaults(mode="weak")
    scale.add_argument("--steps", type=int, default=20, help="measured steps per run, after a warm-up (default: 20)")
    add_set(scale)
    scale.add_argument(
        "--engine", choices=field_choices(EngineConfig, "name"), help="the training engine (engine.name)"
    )
    scale.add_argument(
        "--side-by-side",
        action="store_true",
        help="also run N independent 1-process runs at once "
        "for each N > 1: what the machine does for trials that need no communication",
    )
    scale.add_argument(
        "--out",
        help="the series folder: its run directories, scaling.png and scaling.json "
        "(default: <runs-root>/<name>-scale-<timestamp>)",
    )
    scale.add_argument(
        "--runs-root", help="where a new series folder goes (default: $TRAINBOOK_RUNS or ./runs of the project)"
    )
    add_json(scale, "the table")
    scale.set_defaults(func=cmd_scale)


def cmd_scale(args) -> int:
    from toolkit.fsio import atomic_write_text
    from toolkit.runs import scaling

    overrides = config_overrides(args.set, engine=args.engine)
    counts = scaling.parse_counts(args.nproc) if args.nproc is not None else None
    plan = scaling.plan(
        args.config,
        overrides,
        counts,
        mode=args.mode,
        steps=args.steps,
        out=args.out,
        runs_root=args.runs_root,
        side_by_side=args.side_by_side,
    )  # refusals: before any run
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
        print_json(document)
    else:
        print(result.table())
        print(f"picture: {result.picture}\nresults: {out / 'scaling.json'}")
    return 0
