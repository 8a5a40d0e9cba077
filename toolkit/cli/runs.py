"""``trainbook runs``: runs indexed in the workspace: state, step, data asset, engine."""

from __future__ import annotations

from toolkit.cli.common import add_json, add_workspace, listing_json, print_json, workspace_line
from toolkit.cli.conventions import add_verb
from toolkit.tables import Column, text_table


def register(verbs) -> None:
    runs = add_verb(
        verbs,
        "runs",
        "runs indexed in the workspace: state, step, data asset, engine",
        ["trainbook runs", "trainbook runs --data pydoc --json"],
    )
    runs.add_argument("--data", help="only runs on this data asset (NAME or NAME:VERSION)")
    add_workspace(runs)
    add_json(runs, "the runs")
    runs.set_defaults(func=cmd_runs)


def cmd_runs(args) -> int:
    from toolkit.catalogue.workspace import Workspace
    from toolkit.runs.run_index import list_runs

    ws = Workspace.existing(args.workspace)
    rows = list_runs(ws.root, data=args.data) if ws else []
    if args.json:
        print_json(listing_json(ws, "runs", rows))
        return 0
    print(workspace_line(ws, args.workspace))
    if not rows:
        print("no runs" + (f" on {args.data}" if args.data and ws else "") + ": try `trainbook train demo`")
        return 0
    print(
        text_table(
            rows,
            [
                Column("run directory", "run_dir"),
                Column("state", "state"),
                Column("step", "step", ",", right=True),
                Column("data", "data"),
                Column("engine", lambda r: f"{r['engine']} x{r['nproc']}"),
            ],
        )
    )
    return 0
