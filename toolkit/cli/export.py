"""``trainbook export``: RUN_DIR/model/: safetensors, ONNX and a parity report from the latest checkpoint;
--register adds it to the workspace's models."""

from __future__ import annotations

from toolkit.cli.common import add_json, add_trust_run, add_workspace, print_json
from toolkit.cli.conventions import add_verb


def register(verbs) -> None:
    export = add_verb(
        verbs,
        "export",
        "RUN_DIR/model/: safetensors, ONNX and a parity report from the latest "
        "checkpoint; --register adds it to the workspace's models",
        ["trainbook export RUN_DIR", "trainbook export RUN_DIR --register demo"],
    )
    export.add_argument("run_dir", help="a run with at least one valid checkpoint")
    export.add_argument("--out", help="model folder (default: RUN_DIR/model)")
    add_trust_run(export)
    export.add_argument(
        "--register",
        nargs="?",
        const="",
        metavar="NAME",
        help="register the export as NAME (default: the run's config name)",
    )
    add_workspace(export)
    add_json(export, "the export's summary")
    export.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
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
        print_json(
            {
                "path": str(result.path),
                "parity_ok": result.parity_ok,
                "parity": result.parity,
                "manifest": result.manifest,
                "registered": model.ref if model else None,
            }
        )
    else:
        print(result.summary())
        if model:
            print(f"registered    {model.ref} (data {model.data}, run {model.run_dir})")
    return 0 if result.parity_ok else 1
