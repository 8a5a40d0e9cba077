"""``trainbook workshop``: run the notebooks for N participants in parallel, then compare."""

from __future__ import annotations

from toolkit.cli.conventions import add_verb, add_verbs


def register(verbs) -> None:
    workshop = add_verb(
        verbs,
        "workshop",
        "run the notebooks for N participants in parallel, then compare",
        ["trainbook workshop run --participants 4 --params sets.yaml"],
    )
    workshop_verbs = add_verbs(workshop, "workshop_verb")
    wrun = add_verb(
        workshop_verbs,
        "run",
        "one papermill run per parameter set, as many at once as cores",
        ["trainbook workshop run --participants 4 --params sets.yaml --notebook 03_training"],
    )
    wrun.add_argument("--participants", type=int, required=True, help="how many parameter sets to run")
    wrun.add_argument("--params", required=True, help="YAML list of parameter sets, one per participant")
    wrun.add_argument("--notebook", default="03_training", help="which notebook (default: 03_training)")
    wrun.add_argument("--parallel", type=int, help="runs at once (default: the core count)")
    wrun.add_argument("--out", help="report folder (default: outputs/workshop-<time>)")
    wrun.set_defaults(func=cmd_workshop_run)


def cmd_workshop_run(args) -> int:
    from toolkit.report.workshop import main_run

    return main_run(args)
