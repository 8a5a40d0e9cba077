"""``trainbook advise``: how often to checkpoint (Young/Daly) from a run's measured cost."""

from __future__ import annotations

from toolkit.cli.conventions import add_verb
from toolkit.config import ConfigError
from toolkit.errors import not_allowed


def register(verbs) -> None:
    adv = add_verb(
        verbs,
        "advise",
        "how often to checkpoint (Young/Daly) from a run's measured cost",
        ["trainbook advise RUN_DIR --gpus 64"],
    )
    adv.add_argument("run_dir", help="a run that has saved at least one checkpoint")
    adv.add_argument("--mtbf-hours", type=float, help="mean time between failures of the whole job")
    adv.add_argument(
        "--gpus",
        type=int,
        default=8,
        help="GPUs in the job, for the default MTBF (Llama 3's 1 failure per ~50,700 GPU-hours)",
    )
    adv.add_argument("--restart-seconds", type=float, default=60.0, help="time from failure to training again")
    adv.set_defaults(func=cmd_advise)


def cmd_advise(args) -> int:
    from toolkit.checkpoint.interval_advisor import advise_for_run, mtbf_for_gpus

    if args.mtbf_hours is not None and args.mtbf_hours <= 0:
        raise ConfigError(not_allowed("--mtbf-hours", args.mtbf_hours, "a positive number"))
    if args.gpus < 1:
        raise ConfigError(not_allowed("--gpus", args.gpus, "1 or more"))
    mtbf = args.mtbf_hours * 3600 if args.mtbf_hours is not None else mtbf_for_gpus(args.gpus)
    print(advise_for_run(args.run_dir, mtbf_s=mtbf, restart_s=args.restart_seconds).summary())
    return 0
