"""The command lines that start a run's training processes: one process, torchrun, or the DeepSpeed launcher.

Imports no torch: the supervisor and the doctor build these commands without loading a framework. A launcher runs
as ``python -m toolkit.runs.launchers LAUNCHER ARGS`` (see :func:`main`), not as its own module.
"""

from __future__ import annotations

import base64
import json
import os
import select
import sys
import time
from pathlib import Path

from toolkit.ports import free_port


def resolve_launcher(engine_cfg) -> str | None:
    if engine_cfg.nproc == 1:
        return None
    if engine_cfg.launcher != "auto":
        return engine_cfg.launcher
    return "deepspeed" if engine_cfg.name == "deepspeed" else "torchrun"


def _launcher(name: str) -> list[str]:
    return [sys.executable, "-u", "-m", "toolkit.runs.launchers", name]  # this module's main()


def _torchrun(cfg, run_dir, port):
    return [
        *_launcher("torchrun"),
        "--nnodes=1",
        f"--nproc_per_node={cfg.engine.nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "-m",
        "toolkit.runs.worker",
        str(run_dir),
    ]


def _deepspeed(cfg, run_dir, port):
    # The DeepSpeed launcher's per-node half, deepspeed.launcher.launch, run with this interpreter so the venv's
    # packages are used. Its front, deepspeed.launcher.runner (the `deepspeed` command), only works out this world
    # (one node, ranks 0..nproc-1: what it makes of --num_gpus) and starts this same command, at the cost of a
    # process that imports torch and DeepSpeed (seconds of CPU) per attempt.
    world = {"localhost": list(range(cfg.engine.nproc))}
    return [
        *_launcher("deepspeed"),
        f"--world_info={base64.urlsafe_b64encode(json.dumps(world).encode()).decode()}",
        "--master_addr=127.0.0.1",
        f"--master_port={port}",
        "--module",
        "--no_local_rank",
        "toolkit.runs.worker",
        str(run_dir),
    ]


LAUNCHERS = {"torchrun": _torchrun, "deepspeed": _deepspeed}


def _torchrun_main():
    from torch.distributed.run import main

    return main


class ChildWatch:
    """Stands in for the ``time`` module inside ``deepspeed.launcher.launch``. That launcher looks at its ranks, then
    calls ``time.sleep(1)``, also after the last one has ended: a launch ended up to two seconds after its ranks, and a
    killed rank was noticed up to a second late. ``sleep`` here ends as soon as a child of this process ends (a pidfd
    turns readable when its process exits), or when none is left, and at the latest after ``seconds``; everything
    else is the ``time`` module's."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        import psutil

        fds = []
        try:
            for child in psutil.Process().children():
                try:
                    fds.append(os.pidfd_open(child.pid))
                except ProcessLookupError:  # reaped since it was listed: the caller has news already
                    return
            if fds:
                select.select(fds, [], [], seconds)
        finally:
            for fd in fds:
                os.close(fd)


def _deepspeed_main():
    from toolkit.third_party import import_deepspeed

    import_deepspeed()  # its accelerator named and the autotuner's mlflow import held off, as in the ranks
    from deepspeed.launcher import launch

    launch.time = ChildWatch()
    return launch.main


LAUNCHER_MAINS = {"torchrun": _torchrun_main, "deepspeed": _deepspeed_main}


def main() -> None:
    """``python -m toolkit.runs.launchers LAUNCHER ARGS``: torchrun (torch.distributed.run) or DeepSpeed's per-node
    launcher (deepspeed.launcher.launch) with its own ARGS, loaded as a rank loads (toolkit.startup). It lives as long
    as the training processes it starts."""
    from toolkit.startup import long_lived

    with long_lived():
        launcher_main = LAUNCHER_MAINS[sys.argv.pop(1)]()
    launcher_main()


def _torchrun_nodes(cfg, run_dir, nodes) -> list[str]:
    """One node of a multi-node job (toolkit.runs.job): torchrun's static rendezvous on node 0, one port above the
    nodes' own store. Both engines: deepspeed.init_distributed reads the same variables, and the DeepSpeed launcher
    would need SSH between nodes."""
    return [
        *_launcher("torchrun"),
        f"--nnodes={nodes.count}",
        f"--node_rank={nodes.rank}",
        f"--nproc_per_node={cfg.engine.nproc}",
        f"--master_addr={nodes.addr}",
        f"--master_port={nodes.training_port}",
        "-m",
        "toolkit.runs.worker",
        str(run_dir),
    ]


# An elastic rendezvous waits this long, once it has its minimum of nodes, for more to join the same round
ELASTIC_LAST_CALL_S = 5


def elastic_command(cfg, run_dir: Path, nodes, min_nodes: int, max_restarts: int) -> tuple[list[str], dict[str, str]]:
    """One node of an elastic job (toolkit.runs.job --nnodes MIN:MAX): torchrun's elastic agent with a c10d rendezvous
    on node 0 (one port above the nodes' MASTER_PORT). It starts the ranks once MIN nodes are there, and when a node
    joins (or is lost) it stops them (SIGTERM: the trainer checkpoints, toolkit.status.ELASTIC_ENV) and starts them
    again at the new world size, up to --max-restarts failures."""
    from toolkit.status import ELASTIC_ENV

    command = [
        *_launcher("torchrun"),
        f"--nnodes={min_nodes}:{nodes.count}",
        f"--nproc_per_node={cfg.engine.nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={nodes.addr}:{nodes.training_port}",
        f"--rdzv-id={run_dir.name}",
        # node 0 hosts the rendezvous store; said outright, as a second node on one machine would think it may too
        f"--rdzv-conf=is_host={'true' if nodes.rank == 0 else 'false'},last_call_timeout={ELASTIC_LAST_CALL_S}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=1",
        "-m",
        "toolkit.runs.worker",
        str(run_dir),
    ]
    # torch 2.13's agent keeps the first round's store address when it shares its rendezvous store with the ranks,
    # and a node that joins a later round waits for an address nobody writes: each round gets its own
    return command, {"PYTHONUNBUFFERED": "1", ELASTIC_ENV: "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def worker_command(cfg, run_dir: Path, nodes=None) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment that start every rank of this run (of this node's ranks, with
    ``nodes``: a toolkit.runs.nodes.NodeSpec)."""
    env = {"PYTHONUNBUFFERED": "1"}
    if nodes is not None and nodes.count > 1:
        return _torchrun_nodes(cfg, run_dir, nodes), env
    launcher = resolve_launcher(cfg.engine)
    if launcher is None:
        return [sys.executable, "-m", "toolkit.runs.worker", str(run_dir)], env
    return LAUNCHERS[launcher](cfg, run_dir, free_port()), env


if __name__ == "__main__":
    main()
