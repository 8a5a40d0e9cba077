"""``trainbook resume``: continue a stopped or killed run from its latest valid checkpoint."""

from __future__ import annotations

import sys

from toolkit.cli.common import add_max_restarts, add_trust_run, check_max_restarts
from toolkit.cli.conventions import add_verb
from toolkit.cli.following import start_and_follow


def register(verbs) -> None:
    resume = add_verb(
        verbs,
        "resume",
        "continue a stopped or killed run from its latest valid checkpoint",
        ["trainbook resume runs/demo-20261125-101500", "trainbook resume RUN_DIR --from step_00000040"],
    )
    resume.add_argument("run_dir", help="the run directory to continue")
    add_max_restarts(resume)
    resume.add_argument(
        "--from",
        dest="from_checkpoint",
        metavar="CHECKPOINT",
        help="roll back to this checkpoint (e.g. step_00000040); newer ones are kept aside",
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
            )
        except launch.NothingToResume as done:
            print(done, file=sys.stderr)
            return None
        print(handle.plan, file=sys.stderr)
        return handle

    return start_and_follow(start)
