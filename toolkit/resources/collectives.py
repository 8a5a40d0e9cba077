"""All-reduce bandwidth across N local processes, reported like nccl-tests' ``all_reduce_perf``.

For a message of S bytes that takes t seconds on n ranks:
    algbw = S / t                    what the caller sees
    busbw = algbw * 2 (n - 1) / n    what each link carried (a ring all-reduce sends 2 (n-1)/n of the data),
                                     comparable across rank counts and with the hardware's link speed
Each size is also checked for the right answer (the sum of every rank's values), like nccl-tests' -c 1.

The ranks run under torchrun, the launcher training uses, so a launcher or backend problem shows up here first:
``python -m toolkit.resources.collectives --out FILE`` is the rank entry; :func:`allreduce_sweep` starts it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.errors import RefusedValue, not_allowed
from toolkit.tables import Column, text_table

DEFAULT_SIZES = tuple(4**k * 1024 for k in range(0, 8))  # 1 KiB .. 16 MiB, x4 each step
MIN_ITERS, MAX_ITERS, SECONDS_PER_SIZE = 3, 50, 0.25


@dataclass(frozen=True)
class SweepRow:
    size_bytes: int
    iters: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    correct: bool


@dataclass(frozen=True)
class SweepResult:
    backend: str
    nproc: int
    rows: list[SweepRow]

    def to_details(self) -> dict:
        """The JSON-ready form the doctor's report keeps (and :meth:`from_details` reads back)."""
        return {
            "backend": self.backend,
            "nproc": self.nproc,
            "rows": [asdict(r) for r in self.rows],
            "table": self.table(),
        }

    @classmethod
    def from_details(cls, details: dict) -> SweepResult:
        return cls(details["backend"], details["nproc"], [SweepRow(**row) for row in details["rows"]])

    @property
    def peak_busbw_gbps(self) -> float:
        return max((r.busbw_gbps for r in self.rows), default=0.0)

    def table(self) -> str:
        return f"all_reduce (sum, float32), {self.nproc} processes, {self.backend}\n" + text_table(
            self.rows,
            [
                Column("size", lambda r: _size(r.size_bytes), right=True),
                Column("iters", "iters", right=True),
                Column("time us", "time_us", ",.1f", right=True),
                Column("algbw GB/s", "algbw_gbps", ".3f", right=True),
                Column("busbw GB/s", "busbw_gbps", ".3f", right=True),
                Column("check", lambda r: "ok" if r.correct else "WRONG"),
            ],
        )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024
    return str(n)


def _rank_main(sizes: list[int], out: Path | None) -> None:
    import torch
    import torch.distributed as dist

    from toolkit.train.distributed import resolve_backend

    backend = resolve_backend("auto")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    try:
        for size in sizes:
            count = max(size // 4, 1)
            buf = torch.full((count,), float(rank + 1), device=device)
            dist.all_reduce(buf)  # warm-up: connections and buffers are set up on first use
            expected = world * (world + 1) / 2  # ranks hold 1..n; their sum after one all-reduce
            correct = bool(torch.all(buf == expected))
            # Adaptive iteration count, agreed by all ranks (rank 0 decides), so everyone calls the same number.
            sync()
            t0 = time.perf_counter()
            dist.all_reduce(torch.zeros(count, device=device))
            sync()
            probe = time.perf_counter() - t0
            iters = torch.tensor([min(MAX_ITERS, max(MIN_ITERS, int(SECONDS_PER_SIZE / max(probe, 1e-6))))])
            dist.broadcast(iters, src=0)
            iters = int(iters)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(buf)
            sync()
            elapsed = (time.perf_counter() - t0) / iters
            worst = torch.tensor([elapsed], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the slowest rank decides, as in nccl-tests
            elapsed = float(worst)
            algbw = count * 4 / elapsed / 1e9
            rows.append(SweepRow(count * 4, iters, elapsed * 1e6, algbw, algbw * 2 * (world - 1) / world, correct))
    finally:
        dist.destroy_process_group()
    if rank == 0 and out is not None:
        out.write_text(json.dumps(SweepResult(backend, world, rows).to_details()))


class CollectiveError(RuntimeError):
    """The ranks did not start, hung, or failed; the message carries the end of their output."""


def allreduce_sweep(nproc: int = 2, sizes=DEFAULT_SIZES, timeout: float = 120.0) -> SweepResult:
    """Start ``nproc`` ranks on this machine with torchrun and time an all-reduce for each size."""
    from toolkit.ports import free_port

    if nproc < 2:
        raise RefusedValue(not_allowed("nproc", nproc, "2 or more (a collective needs peers)"))
    with tempfile.TemporaryDirectory(prefix="trainbook-allreduce-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_port()}",
            "-m",
            "toolkit.resources.collectives",
            "--out",
            str(out),
            "--sizes",
            ",".join(map(str, sizes)),
        ]
        # One thread per rank: the bandwidth of the transport, not a fight between ranks for the same cores.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise CollectiveError(f"all_reduce across {nproc} processes did not finish in {timeout:.0f} s") from None
        if proc.returncode != 0 or not out.exists():
            raise CollectiveError(
                f"all_reduce across {nproc} processes failed (exit {proc.returncode}): " + proc.stderr.strip()[-1500:]
            )
        return SweepResult.from_details(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of the all-reduce sweep (started by torchrun)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    args = parser.parse_args(argv)
    _rank_main([int(s) for s in args.sizes.split(",")], args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
