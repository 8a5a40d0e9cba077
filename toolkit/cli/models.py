"""``trainbook models``: registered models: version, size, data and run they came from."""

from __future__ import annotations

from toolkit.cli.common import add_json, add_workspace, listing_json, local_time, print_json, workspace_line
from toolkit.cli.conventions import add_verb
from toolkit.tables import Column, text_table


def register(verbs) -> None:
    models = add_verb(
        verbs,
        "models",
        "registered models: version, size, data and run they came from",
        ["trainbook models", "trainbook models --json"],
    )
    add_workspace(models)
    add_json(models, "the models")
    models.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    import dataclasses

    from toolkit.catalogue.model_registry import list_models
    from toolkit.catalogue.workspace import Workspace

    ws = Workspace.existing(args.workspace)
    models = list_models(ws) if ws else []
    if args.json:
        print_json(listing_json(ws, "models", [{"ref": m.ref, **dataclasses.asdict(m)} for m in models]))
        return 0
    print(workspace_line(ws, args.workspace))
    if not models:
        print("no models: try `trainbook export RUN_DIR --register NAME`")
        return 0
    print(
        text_table(
            models,
            [
                Column("model", "ref"),
                Column("size MB", lambda m: m.size_bytes / 2**20, ".1f", right=True),
                Column("created", lambda m: local_time(m.created)),
                Column("data", "data"),
                Column("run", "run_dir"),
            ],
        )
    )
    return 0
