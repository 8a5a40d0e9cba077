"""A multi-node job on this machine: one process tree per "node", as Azure ML starts them, for tests and benchmarks.

    job = LocalNodesJob(workdir, run_dir, config_file, nodes=2)   # node k runs in workdir/node<k>
    job.wait()                                                    # [exit code of node 0, of node 1]

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
    ):
        self.port = free_port_pair()
        self.logs = [workdir / f"node{k}" / f"job-{self.port}.log" for k in range(nodes)]
        self.processes = []
        for k in range(nodes):
            local = workdir / f"node{k}"
            local.mkdir(parents=True, exist_ok=True)
            env = {
                **os.environ,
                **SAFE_PATH_ENV,
                "NODE_RANK": str(k),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(self.port),
                "TRAINBOOK_CACHE": str(local / "cache"),
            }
            with open(self.logs[k], "wb") as log:
                self.processes.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "toolkit.runs.job",
                            str((node_run_dirs or {}).get(k, run_dir)),
                            "--config",
                            str(config),
                            "--nnodes",
                            str(nodes),
                            "--max-restarts",
                            str(max_restarts),
                            "--lost-after",
                            str(lost_after_s),
                            *flags,
                        ],
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
