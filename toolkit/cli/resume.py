"""``trainbook resume``: continue a stopped or killed run from its latest valid checkpoint."""

from __future__ import annotations

import sys

from toolkit.cli.common import add_max_restarts, add_set, add_trust_run, check_max_restarts
from toolkit.cli.conventions import add_verb
from toolkit.cli.following import start_and_follow


def register(verbs) -> None:
    resume = add_verb(
        verbs,
        "resume",
        "continue a stopped or killed run from its latest valid checkpoint",
        [
            "trainbook resume runs/demo-20261125-101500",
            "trainbook resume RUN_DIR --from step_00000040",
            "trainbook resume RUN_DIR --set engine.nproc=1 --set engine.tensor_parallel=1",
        ],
    )
    resume.add_argument("run_dir", help="the run directory to continue")
    add_max_restarts(resume)
    resume.add_argument(
        "--from",
        dest="from_checkpoint",
        metavar="CHECKPOINT",
        help="roll back to this checkpoint (e.g. step_00000040); newer ones are kept aside",
    )
    add_set(
        resume,
        help="change a field that may change between attempts (repeatable): the step budget, logging, checkpoints, "
        "engine.nproc with engine.tensor_parallel (the same data-parallel replicas)",
    )
    add_trust_run(resume)
    resume.set_defaults(func=cmd_resume)


def cmd_resume(args) -> int:
    from toolkit.runs import launch

    check_max_restarts(args.max_restarts)

    def start():
        try:
            handle = launch.resume(
                args.run_dir,
                max_restarts=args.max_restarts,
                from_checkpoint=args.from_checkpoint,
                trust_run=args.trust_run,
                changes=args.set or [],
            )
        except launch.NothingToResume as done:
            print(done, file=sys.stderr)
            return None
        print(handle.plan, file=sys.stderr)
        return handle

    return start_and_follow(start)
