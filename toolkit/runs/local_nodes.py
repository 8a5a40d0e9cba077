"""A multi-node job on this machine: one process tree per "node", as Azure ML starts them, for tests and benchmarks.

    job = LocalNodesJob(workdir, run_dir, config_file, nodes=2)   # node k runs in workdir/node<k>
    job.wait()                                                    # [exit code of node 0, of node 1]

    job = LocalNodesJob(workdir, run_dir, config_file, nodes=2, elastic_min=1, start=1)   # an elastic job: node 0
    job.start_node(1)                                                                    # ... and later node 1

Each node is ``python -m toolkit.runs.job`` with NODE_RANK, MASTER_ADDR=127.0.0.1 and MASTER_PORT set (what Azure ML's
PyTorch distribution sets), its own session, and its own node-local folder (its token cache, its log); the run
directory is wherever ``run_dir`` says, normally one folder all nodes share, as an rw_mount output is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from toolkit.paths import SAFE_PATH_ENV
from toolkit.ports import free_port_pair


class LocalNodesJob:
    """One submission of a job to ``nodes`` simulated nodes."""

    def __init__(
        self,
        workdir: Path,
        run_dir: Path,
        config: Path,
        *flags: str,
        nodes: int = 2,
        max_restarts: int = 0,
        lost_after_s: float = 4.0,
        node_run_dirs: dict[int, Path] | None = None,
        elastic_min: int | None = None,
        start: int | None = None,
    ):
        """``elastic_min``: an elastic job of elastic_min to ``nodes`` nodes (--nnodes MIN:MAX); ``start``: the nodes
        started now (the first ones; the rest with :meth:`start_node`), all when None."""
        self.port = free_port_pair()
        self.workdir, self.run_dir, self.node_run_dirs = workdir, run_dir, node_run_dirs or {}
        self.logs = [workdir / f"node{k}" / f"job-{self.port}.log" for k in range(nodes)]
        nnodes = f"{elastic_min}:{nodes}" if elastic_min is not None else str(nodes)
        self.arguments = [
            "--config",
            str(config),
            "--nnodes",
            nnodes,
            "--max-restarts",
            str(max_restarts),
            "--lost-after",
            str(lost_after_s),
            *flags,
        ]
        self.processes: list[subprocess.Popen] = []
        for k in range(nodes if start is None else start):
            self.start_node(k)

    def start_node(self, k: int) -> None:
        """Start node ``k`` (the nodes start in order)."""
        assert k == len(self.processes), f"node {len(self.processes)} starts next, not {k}"
        local = self.workdir / f"node{k}"
        local.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            **SAFE_PATH_ENV,
            "NODE_RANK": str(k),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.port),
            "TRAINBOOK_CACHE": str(local / "cache"),
        }
        run_dir = self.node_run_dirs.get(k, self.run_dir)
        with open(self.logs[k], "wb") as log:
            self.processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", "toolkit.runs.job", str(run_dir), *self.arguments],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=local,
                    start_new_session=True,
                )
            )

    def wait(self, timeout: float | None = None) -> list[int]:
        """Every node's exit code, once all have ended."""
        return [p.wait(timeout=timeout) for p in self.processes]

    def output(self, node: int) -> str:
        return self.logs[node].read_text(errors="replace")

    def lose_node(self, node: int) -> None:
        """The node vanishes: every process of its tree (job entry, torchrun, ranks) SIGKILLed at once."""
        import psutil

        root = psutil.Process(self.processes[node].pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.processes[node].wait()
