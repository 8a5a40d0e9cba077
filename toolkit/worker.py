"""Entry point of one training process: ``python -m toolkit.worker RUN_DIR`` (a launcher starts one per rank).

The config comes from RUN_DIR/config.yaml, never from arguments, so what ran is exactly what was written.
"""

from __future__ import annotations

import os
import sys
import traceback

from toolkit.rundir import RunDir


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m toolkit.worker RUN_DIR", file=sys.stderr)
        return 2
    run = RunDir(argv[0])
    trainer = None
    try:
        from toolkit.trainer import Trainer

        trainer = Trainer(run)
        trainer.train()
        return 0
    except Exception as exc:
        traceback.print_exc()
        if int(os.environ.get("RANK", "0")) == 0:
            message = f"{type(exc).__name__}: {exc}"
            if trainer is not None and trainer.sink is not None:
                trainer.sink.fail(message)
            else:  # failed while building: no sink yet, but the run directory must still say why
                run.append_event("error", message=message)
                run.write_status(state="failed", error=message)
        return 1
    finally:
        if trainer is not None:
            trainer.close()


if __name__ == "__main__":
    sys.exit(main())
