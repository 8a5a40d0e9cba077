"""How the ranks tell rank 0 that their part of a checkpoint is durable: through the process group's store.

Every rank writes its own files into the checkpoint's folder, then reports what it wrote (names, sizes, checksums)
or why it could not. Rank 0 publishes the checkpoint once every rank has reported. The reports travel through the
TCP store the ranks rendezvoused on (MASTER_ADDR:MASTER_PORT: torchrun's agent, or rank 0 under the DeepSpeed
launcher), never through marker files: on a multi-node job the folder lives on shared storage, and what one node
writes there another may see late (blob mounts cache listings), where a store key is seen at once.

The writer thread has its own connection to the store: a rank-0 wait of minutes must never hold the connection the
training thread's collectives set up groups through.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

KEY_PREFIX = "trainbook/checkpoint"


def _key(step: int, rank: int) -> str:
    return f"{KEY_PREFIX}/{step}/rank_{rank:05d}"


class PeerReports:
    """One rank's side of the checkpoint reports (made from the writer thread, lazily connected)."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        self._store = None

    def _connect(self):
        if self._store is None:
            import torch.distributed as dist

            self._store = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                is_master=False,
                wait_for_workers=False,
                timeout=timedelta(seconds=60),
            )
        return self._store

    def report(self, step: int, files: dict) -> None:
        """This rank's files of checkpoint ``step`` are written and fsynced (rank 0 keeps its own)."""
        if self.rank != 0:
            self._connect().set(_key(step, self.rank), json.dumps({"files": files}))

    def report_failure(self, step: int, reason: str) -> None:
        """This rank could not write its part of checkpoint ``step``: rank 0 gives the checkpoint up at once."""
        if self.rank != 0:
            self._connect().set(_key(step, self.rank), json.dumps({"failed": reason}))

    def gather(self, step: int, own_files: dict, timeout_s: float) -> dict:
        """Rank 0: every rank's files of checkpoint ``step`` (name -> description), once all have reported.
        Raises RuntimeError naming the ranks that failed, TimeoutError naming those that never reported."""
        files = dict(own_files)
        if self.world_size == 1:
            return files
        store = self._connect()
        keys = [_key(step, r) for r in range(1, self.world_size)]
        try:
            store.wait(keys, timedelta(seconds=timeout_s))
        except Exception:  # the store's own timeout error (a DistStoreError): say who is missing
            missing = [f"rank {r}" for r, key in zip(range(1, self.world_size), keys) if not store.check([key])]
            raise TimeoutError(
                f"checkpoint step {step}: no report from {', '.join(missing) or 'a rank'} after {timeout_s:.0f} s"
            ) from None
        failed = []
        for rank, key in zip(range(1, self.world_size), keys):
            report = json.loads(store.get(key))
            store.delete_key(key)  # a long run saves thousands of checkpoints: the store keeps nothing of them
            if "failed" in report:
                failed.append(f"rank {rank}: {report['failed']}")
            else:
                files.update(report["files"])
        if failed:
            raise RuntimeError(f"checkpoint step {step}: other ranks failed to write ({'; '.join(failed)})")
        return files
