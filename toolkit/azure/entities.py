"""One Trainbook config + plan options -> the azure-ai-ml entities: AmlCompute, Environment, Data, CommandJob.

Every builder takes values that were already validated (see plan.py) and only assembles SDK objects.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from toolkit.azure.skus import Sku

# Azure Container for PyTorch (ACPT): Microsoft's curated training image with PyTorch, CUDA, NCCL, DeepSpeed and
# OpenMPI built and tested together. The newest definition in Azure/azureml-assets
# (assets/training/general/environments/acpt-pytorch-2.8-cuda12.6) publishes this name on mcr; `:latest` follows
# Microsoft's patched rebuilds. Pin a numbered tag with --image for bit-for-bit reruns.
DEFAULT_IMAGE = "mcr.microsoft.com/azureml/curated/acpt-pytorch-2.8-cuda12.6:latest"
ENVIRONMENT_NAME = "trainbook"
EXPERIMENT_NAME = "trainbook"
CONFIG_INPUT = "trainbook-config.yaml"  # the resolved config, written next to job.yaml
RUN_DIR = "outputs/run"  # Azure ML uploads ./outputs as the job's artifacts, so the run directory lands there
TB_DIR = f"{RUN_DIR}/tb"


def command(with_data: bool) -> str:
    """The job's command: one process per rank (PyTorchDistribution sets RANK, WORLD_SIZE, MASTER_ADDR...)."""
    text = "python -m toolkit.worker " + RUN_DIR + " --config ${{inputs.config}}"
    return text + " --set data.path=${{inputs.data}}" if with_data else text


# --- environment variables -------------------------------------------------------------------------------------
# Azure ML's large-scale training guidance (Azure/azureml-examples, best-practices/largescale-deep-learning:
# Environment/ACPT.md) and the NCCL checks of Azure's HPC images. Each entry: name, value (a function of the size),
# which sizes get it. InfiniBand settings go only to InfiniBand sizes: elsewhere they mean nothing or mislead.


def _gpu(sku: Sku) -> bool:
    return sku.gpus > 0


def _ib(sku: Sku) -> bool:
    return sku.infiniband


def _topo(sku: Sku) -> bool:
    return bool(sku.nccl_topo_file)


ENV_VARS: list[tuple[str, Callable[[Sku], str], Callable[[Sku], bool]]] = [
    # NCCL prints only warnings: enough to see a fallback from InfiniBand to TCP in the job log, without INFO spam.
    ("NCCL_DEBUG", lambda s: "WARN", _gpu),
    # Number GPUs in PCI bus order, the order nvidia-smi and the NCCL topology files use.
    ("CUDA_DEVICE_ORDER", lambda s: "PCI_BUS_ID", _gpu),
    # Bootstrap and socket traffic over the VM's primary NIC, never docker0 or an InfiniBand IPoIB alias.
    ("NCCL_SOCKET_IFNAME", lambda s: "eth0", _gpu),
    # Relaxed PCIe ordering for the InfiniBand HCAs: Azure's virtualised (SR-IOV) IB needs it for full bandwidth.
    ("NCCL_IB_PCI_RELAXED_ORDERING", lambda s: "1", _ib),
    ("UCX_IB_PCI_RELAXED_ORDERING", lambda s: "on", _ib),  # the same for UCX (MPI, NCCL's UCX plugin)
    # Which GPU sits next to which HCA on ND A100 v4 / ND H100 v5; Azure's images ship the file. If a container
    # lacks it NCCL warns and detects the topology itself.
    ("NCCL_TOPO_FILE", lambda s: s.nccl_topo_file, _topo),
]


def environment_variables(sku: Sku) -> dict[str, str]:
    """The NCCL/CUDA variables for ``sku`` (none for CPU sizes)."""
    return {name: value(sku) for name, value, applies in ENV_VARS if applies(sku)}


def shm_size(sku: Sku) -> str:
    """/dev/shm for the container. DataLoader workers hand batches to the trainer through shared memory, and
    Docker's default 64 MB kills them ("bus error") as soon as batches are real-sized; 16g is ample for GPU nodes
    (112 GiB RAM and up), a quarter of RAM on small CPU sizes so shared memory never starves the processes."""
    return f"{min(16, max(1, sku.ram_gib // 4))}g"


# --- entities --------------------------------------------------------------------------------------------------


def compute(name: str, sku: Sku, min_nodes: int, max_nodes: int, idle_seconds: int, low_priority: bool):
    """The AmlCompute cluster spec."""
    from azure.ai.ml.entities import AmlCompute

    return AmlCompute(name=name, size=sku.name, min_instances=min_nodes, max_instances=max_nodes,
                      idle_time_before_scale_down=idle_seconds, tier="low_priority" if low_priority else "dedicated")


def environment_version(image: str, conda_file: Path) -> str:
    """A content version: the same image and environment.yml give the same version, so creating it again is a
    no-op, and any change gets a new version instead of failing on an immutable one."""
    return hashlib.sha256(image.encode() + b"\0" + conda_file.read_bytes()).hexdigest()[:12]


def environment(image: str, conda_file: Path):
    """The Environment: the ACPT image with the project's conda environment on top."""
    from azure.ai.ml.entities import Environment

    return Environment(name=ENVIRONMENT_NAME, version=environment_version(image, conda_file), image=image,
                       conda_file=str(conda_file),
                       description="Trainbook: Azure Container for PyTorch + the project's environment.yml")


def data(asset):
    """The Data asset mirroring a local one: same name, version and type; the local snapshot is the upload."""
    from azure.ai.ml.entities import Data

    tags = {"sha256": asset.sha256, "size_bytes": str(asset.size_bytes), "file_count": str(asset.file_count)}
    return Data(name=asset.name, version=str(asset.version), type=asset.type, path=str(asset.path),
                description=asset.description or f"Trainbook data asset {asset.ref}", tags={**asset.tags, **tags})


def job(cfg, *, compute_name: str, sku: Sku, environment_ref: str, code: Path, instance_count: int,
        processes_per_node: int, config_path: str, data_asset=None):
    """The CommandJob: ``python -m toolkit.worker`` once per rank under PyTorchDistribution.

    DeepSpeed configs use PyTorchDistribution too: Azure ML starts every rank with RANK/WORLD_SIZE/MASTER_ADDR set
    and deepspeed.init_distributed reads them, so no SSH, hostfile or MPI launcher is involved.
    """
    from azure.ai.ml import Input, PyTorchDistribution
    from azure.ai.ml.entities import CommandJob, JobResourceConfiguration, TensorBoardJobService

    inputs = {"config": Input(type="uri_file", path=config_path)}
    if data_asset is not None:
        inputs["data"] = Input(type=data_asset.type, path=f"azureml:{data_asset.name}:{data_asset.version}",
                               mode="ro_mount")
    world = instance_count * processes_per_node
    return CommandJob(
        command=command(data_asset is not None), code=str(code), compute=compute_name, environment=environment_ref,
        distribution=PyTorchDistribution(process_count_per_instance=processes_per_node),
        resources=JobResourceConfiguration(instance_count=instance_count, shm_size=shm_size(sku)),
        environment_variables=environment_variables(sku), inputs=inputs,
        services={"tensorboard": TensorBoardJobService(log_dir=TB_DIR)},
        experiment_name=EXPERIMENT_NAME, display_name=cfg.name,
        description=f"Trainbook {cfg.name}: {cfg.engine.name} on {instance_count} x {sku.name}, world size {world}",
        tags={"trainbook_config_sha256": cfg.fingerprint(), "engine": cfg.engine.name, "world_size": str(world),
              **({"data": f"{data_asset.name}:{data_asset.version}"} if data_asset is not None else {})})
