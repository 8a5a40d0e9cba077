"""Process-group setup shared by both engines: who am I, how many are we, which device and backend."""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import dataclass

import torch
import torch.distributed as dist

from toolkit.ports import free_port


@dataclass(frozen=True)
class Topology:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    tensor_parallel: int = 1
    """Ranks per tensor-parallel group (engine.tensor_parallel): consecutive ranks, one data-parallel replica."""
    pipeline_parallel: int = 1
    """Stages of a pipeline (engine.pipeline_parallel): ranks world / stages apart, one data-parallel replica."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def ranks_per_replica(self) -> int:
        """The ranks that hold one copy of the model between them."""
        return self.tensor_parallel * self.pipeline_parallel

    @property
    def dp_size(self) -> int:
        """Data-parallel replicas: the processes over the ranks each replica takes."""
        return self.world_size // self.ranks_per_replica

    @property
    def dp_rank(self) -> int:
        """Which data-parallel replica this rank belongs to: the one whose batches it draws. Ranks are laid out
        stage-major, then replica, then tensor-parallel rank (Megatron's order: a tensor-parallel group is
        consecutive ranks, a pipeline's stages are the farthest apart)."""
        return self.rank // self.tensor_parallel % self.dp_size


def single_process_env() -> dict[str, str]:
    """The variables a launcher would set, for a world of one (DeepSpeed needs a process group even then)."""
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }


def resolve_backend(requested: str) -> str:
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def setup(engine_cfg) -> Topology:
    """Read the launcher's variables; start the process group when more than one process (or DeepSpeed) needs it."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    needs_group = world_size > 1 or engine_cfg.name in ("deepspeed", "fsdp")  # a mesh even of one
    if needs_group and "MASTER_ADDR" not in os.environ:
        os.environ.update(single_process_env())
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if needs_group and not dist.is_initialized():
        backend = resolve_backend(engine_cfg.backend)
        if engine_cfg.name == "deepspeed":
            from toolkit.third_party import import_deepspeed

            import_deepspeed().init_distributed(dist_backend=backend)
            _unlink_deepspeed_shm_buffer(rank)
        else:
            dist.init_process_group(backend=backend)
    return Topology(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        device=device,
        tensor_parallel=engine_cfg.tensor_parallel,
        pipeline_parallel=engine_cfg.pipeline_parallel,
    )


def all_reduce_sum(values: list[float], device) -> list[float]:
    """Sum a few floats over all ranks (identity in a world of one)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def _unlink_deepspeed_shm_buffer(rank: int) -> None:
    """Remove this rank's name for DeepSpeed's CPU allreduce buffer once every rank has mapped it.

    With LOCAL_SIZE set (the DeepSpeed launcher on CPU), each rank creates a 66 MB file
    /dev/shm/deepspeed_allreduce_buffer_{uid}_{MASTER_ADDR}_{MASTER_PORT}_{rank} and maps every peer's; DeepSpeed
    never unlinks them, so each run left 66 MB per rank of RAM-backed /dev/shm behind. After the barrier all ranks
    have mapped all buffers (DeepSpeed's init waits for each peer's file), so dropping the name keeps the mappings
    and lets the kernel free the memory when the processes end, however they end.
    """
    name = (
        f"deepspeed_allreduce_buffer_{os.getuid()}_{os.environ.get('MASTER_ADDR', '')}_"
        f"{os.environ.get('MASTER_PORT', '')}_{rank}"
    )
    buffer = Path("/dev/shm") / name
    if not buffer.exists():  # no shm allreduce in this world (torchrun sets no LOCAL_SIZE; GPUs use NCCL)
        return
    dist.barrier()
    buffer.unlink(missing_ok=True)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
