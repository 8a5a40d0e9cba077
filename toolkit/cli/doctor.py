"""``trainbook doctor``: validate this machine: versions, collectives, matmul, disk, /dev/shm, a training step per
engine."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.cli.common import add_workspace
from toolkit.cli.conventions import add_verb


def register(verbs) -> None:
    from toolkit.resources.doctor import CHECKS  # check functions import their tools when they run

    doctor = add_verb(
        verbs,
        "doctor",
        "validate this machine: versions, collectives, matmul, disk, /dev/shm, a "
        "training step per engine; exit 0 when every required check passes",
        [
            "trainbook doctor",
            "trainbook doctor --only matmul --only disk",
            "trainbook doctor --skip all-reduce --json report.json",
        ],
    )
    doctor.add_argument(
        "--only",
        action="append",
        metavar="CHECK",
        choices=list(CHECKS),
        help=f"run only this check (repeatable): {', '.join(CHECKS)}",
    )
    doctor.add_argument(
        "--skip", action="append", metavar="CHECK", choices=list(CHECKS), help="skip this check (repeatable)"
    )
    doctor.add_argument("--nproc", type=int, help="processes for the all-reduce sweep (default: GPUs, at least 2)")
    add_workspace(doctor)
    doctor.add_argument("--json", metavar="FILE", help="also write the full report as JSON")
    doctor.set_defaults(func=cmd_doctor)


def cmd_doctor(args) -> int:
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
