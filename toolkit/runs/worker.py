"""Entry point of one training process: ``python -m toolkit.runs.worker RUN_DIR`` (a launcher starts one per rank).

The config comes from RUN_DIR/config.yaml, never from arguments, so what ran is exactly what was written. Someone
wrote RUN_DIR first: `trainbook train` (toolkit.runs.launch), or on a cluster the job entry of node 0
(toolkit.runs.job), which then starts this node's ranks.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import traceback

from toolkit.runs import debugging
from toolkit import status as run_status
from toolkit.startup import long_lived
from toolkit.events import ErrorEvent
from toolkit.rundir import RunDir


def report_native_crashes() -> None:
    """A rank that dies in native code (a segfault in an extension, an abort in a C++ library's teardown: SIGSEGV,
    SIGABRT, SIGBUS, SIGFPE, SIGILL) writes every thread's Python stack to its log (stderr, the run's train.log),
    where a Python error would leave its traceback; otherwise the log ends at the signal with no clue where."""
    faulthandler.enable(file=sys.stderr, all_threads=True)


def main(argv: list[str] | None = None) -> int:
    report_native_crashes()
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.runs.worker", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    run = RunDir(args.run_dir)
    if os.environ.get(run_status.ELASTIC_ENV) == "1" and run.status_path.exists():
        # torchrun restarts an elastic job's ranks when a node joins or leaves, also as the last step has just
        # finished: then there is nothing left to train, and ending well lets the job end with its run
        status = run.read_status()
        if status.get("state") == "completed":
            print(
                f"elastic: the run completed at step {status.get('step')} before the nodes changed; "
                "nothing left to train",
                file=sys.stderr,
            )
            return 0
    trainer = None
    try:
        with long_lived():  # torch, the model and the engine: built once, kept to the end
            from toolkit.train.trainer import Trainer

            # debug.enabled: rank 0 holds until a debugger attaches (after the imports: twice as fast untraced)
            stopped_exit = debugging.wait_for_debugger(run)
            if stopped_exit is not None:  # the run was stopped meanwhile (recorded): nothing to train
                return stopped_exit
            trainer = Trainer(run)
        trainer.train()
        return 0
    except Exception as exc:
        traceback.print_exc()
        if int(os.environ.get("RANK", "0")) == 0 and run.path.is_dir():
            message = f"{type(exc).__name__}: {exc}"
            try:
                if trainer is not None and trainer.sink is not None:
                    trainer.sink.fail(message)
                else:  # failed while building: no sink yet, but the run directory must still say why
                    run.append_event(ErrorEvent(message=message))
                    run_status.transition(run, "fail", error=message)
            except run_status.IllegalTransition:
                pass  # the run's end was recorded meanwhile (a stop, a lost supervisor): it stands
        return 1
    finally:
        if trainer is not None:
            trainer.close()


if __name__ == "__main__":
    sys.exit(main())
