"""``trainbook checkpoints``: list a run's checkpoints: step, size, age, valid or not."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from toolkit.cli.common import add_json, print_json
from toolkit.cli.conventions import add_verb
from toolkit.errors import MissingPath, not_allowed
from toolkit.tables import Column, text_table


def register(verbs) -> None:
    ckpts = add_verb(
        verbs,
        "checkpoints",
        "list a run's checkpoints: step, size, age, valid or not",
        ["trainbook checkpoints RUN_DIR", "trainbook checkpoints RUN_DIR --quick --json"],
    )
    ckpts.add_argument("run_dir", help="the run directory")
    ckpts.add_argument("--quick", action="store_true", help="check sizes only, not sha256")
    add_json(ckpts, "the checkpoints")
    ckpts.set_defaults(func=cmd_checkpoints)


def cmd_checkpoints(args) -> int:
    from toolkit.checkpoint.store import CheckpointStore

    if not Path(args.run_dir).is_dir():
        raise MissingPath(not_allowed("run_dir", args.run_dir, "a run directory", problem="is not a folder"))
    store = CheckpointStore(args.run_dir)
    infos = store.list(verify=not args.quick)
    untrusted = _untrusted_notice(args.run_dir)
    latest = store.latest_name()
    if args.json:
        print_json(
            {
                "run_dir": str(store.root),
                "latest": latest,
                "checkpoints": [
                    {
                        "name": i.name,
                        "step": i.step,
                        "size_bytes": i.size_bytes,
                        "created": i.created,
                        "valid": i.valid,
                        "reason": i.reason or None,
                    }
                    for i in infos
                ],
                "untrusted_fields": untrusted,
            }
        )
        return 0
    if untrusted:
        from toolkit.trust import FLAG, describe

        print(f"note: not your run's settings (resume needs {FLAG}): {describe(untrusted)}", file=sys.stderr)
    if not infos:
        print(f"no checkpoints in {store.root}")
        return 0
    now = time.time()
    print(
        text_table(
            infos,
            [
                Column("checkpoint", "name"),
                Column("step", "step", ",", right=True),
                Column("size MB", lambda i: i.size_bytes / 2**20, ".1f", right=True),
                Column("age", lambda i: f"{now - i.created:,.0f} s" if i.created else None, right=True),
                Column(
                    "state",
                    lambda i: (
                        ("valid" if i.valid else f"INVALID: {i.reason}") + (" <- LATEST" if i.name == latest else "")
                    ),
                ),
            ],
        )
    )
    return 0


def _untrusted_notice(run_dir: str) -> dict:
    """The run's fields that resume or export would not honour without --trust-run ({} when none, or when the run
    has no readable config: the checkpoints are listed all the same)."""
    from toolkit.rundir import RunDir

    try:
        return {
            k: v if isinstance(v, (str, int, float, bool)) else str(v)
            for k, v in RunDir(run_dir).untrusted_fields().items()
        }
    except (OSError, ValueError):
        return {}
