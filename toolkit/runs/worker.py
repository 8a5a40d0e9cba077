"""Entry point of one training process: ``python -m toolkit.runs.worker RUN_DIR`` (a launcher starts one per rank).

The config comes from RUN_DIR/config.yaml, never from arguments, so what ran is exactly what was written.

Under a launcher outside Trainbook (Azure ML's PyTorchDistribution, mpirun, Slurm) nobody has written the run
directory yet: ``python -m toolkit.runs.worker RUN_DIR --config FILE [--set section.field=value ...]`` makes the first
process of each node (LOCAL_RANK 0) create it from FILE, and the other processes wait for its config.yaml.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from toolkit.runs import status as run_status
from toolkit.runs.events import ErrorEvent
from toolkit.runs.rundir import RunDir

CONFIG_WAIT_S = 300.0  # a node's first process loads the config and the data index; a slow node may lag


def create_for_external_launcher(run: RunDir, config_file: str, overrides: list[str]) -> None:
    """Write RUN_DIR from the config once per node, exactly as the in-house launcher would have."""
    from toolkit import config as config_mod
    from toolkit.runs.data_pin import pin_data_asset
    from toolkit.train.models.preflight import pin_model

    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        if not run.config_path.exists():
            import torch

            from toolkit.train.engines import check_engine

            cfg = pin_model(pin_data_asset(config_mod.load(config_file, overrides)))
            # this node's own devices and the job's world: fp16, offload and a DeepSpeed file checked where they run
            check_engine(cfg, world=int(os.environ.get("WORLD_SIZE", "1")), cuda=torch.cuda.is_available())
            RunDir.create(run.path, cfg)
        elif int(os.environ.get("RANK", "0")) == 0:  # a restarted job finds its own run directory and resumes it
            run_status.transition(run, "retry", resumed=time.time())
        return
    deadline = time.monotonic() + CONFIG_WAIT_S
    while not run.config_path.exists():  # another process on another code path: no event to wait on
        if time.monotonic() > deadline:
            raise TimeoutError(f"{run.config_path} did not appear within {CONFIG_WAIT_S:.0f} s; "
                               "LOCAL_RANK 0 on this node should have written it")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolkit.runs.worker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir")
    parser.add_argument("--config", help="create RUN_DIR from this config first (external launchers)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    run = RunDir(args.run_dir)
    trainer = None
    try:
        if args.config:
            create_for_external_launcher(run, args.config, args.set)
        from toolkit.train.trainer import Trainer

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
