"""One Trainbook config + plan options -> the azure-ai-ml entities: AmlCompute, Environment, Data, CommandJob;
one exported model + deployment options -> ManagedOnlineEndpoint, Model, ManagedOnlineDeployment.

Every builder takes values that were already validated (see plan.py, deploy_plan.py) and only assembles SDK objects.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from collections.abc import Callable

from toolkit.azure.skus import Sku

# Azure Container for PyTorch (ACPT): Microsoft's curated training image with PyTorch, CUDA, NCCL, DeepSpeed and
# OpenMPI built and tested together. The newest definition in Azure/azureml-assets
# (assets/training/general/environments/acpt-pytorch-2.8-cuda12.6) publishes this name on mcr; `:latest` follows
# Microsoft's patched rebuilds. Pin a numbered tag with --image for bit-for-bit reruns.
DEFAULT_IMAGE = "mcr.microsoft.com/azureml/curated/acpt-pytorch-2.8-cuda12.6:latest"
ENVIRONMENT_NAME = "trainbook"
EXPERIMENT_NAME = "trainbook"
CONFIG_INPUT = "trainbook-config.yaml"  # the resolved config, written next to job.yaml
# Where a job's run directories live (--run-storage datastore): one read-write mounted output on a datastore, every
# run in a folder named after it, so every node sees the same run and a retried or resubmitted job finds it again.
RUNS_OUTPUT = "runs"
RUNS_PREFIX = "trainbook/runs"
DEFAULT_DATASTORE = "workspaceblobstore"  # every workspace has it: its default blob container
# --run-storage local: node-local, Azure ML uploads ./outputs as the job's artifacts once the job ends.
LOCAL_RUN_DIR = "outputs/run"
# The TensorBoard service reads a folder of the job's working directory, and a mounted output's place on the node is
# not known in advance: the job entry (toolkit.runs.job) links this name to the run directory's tb/ on node 0.
TENSORBOARD_LINK = "tensorboard"
SERVICES = ("jupyterlab", "vscode", "tensorboard", "ssh")


def runs_uri(datastore: str, run_name: str | None = None) -> str:
    """The datastore folder of the job's runs output, or of one run in it."""
    return f"azureml://datastores/{datastore}/paths/{RUNS_PREFIX}/" + (f"{run_name}/" if run_name else "")


def run_dir(run_storage: str, run_name: str) -> str:
    """The job's run directory as its command names it."""
    return f"${{{{outputs.{RUNS_OUTPUT}}}}}/{run_name}" if run_storage == "datastore" else LOCAL_RUN_DIR


def command(
    run_storage: str,
    run_name: str,
    *,
    nnodes: int | str,
    gpus_per_node: int,
    max_restarts: int,
    with_data: bool,
    mounted: dict[str, str] | None = None,
) -> str:
    """The job's command, run once per node (toolkit.runs.job: pre-flight, the supervisor and torchrun for the
    node's ranks). ``mounted``: input name -> the config field that names where the job mounts it (the user's model
    code, model weights), e.g. {"model_code": "model.code_path"}."""
    from toolkit.runs.job import command_line

    sets = {"data.path": "${{inputs.data}}"} if with_data else {}
    sets.update({field: f"${{{{inputs.{name}}}}}" for name, field in (mounted or {}).items()})
    return command_line(
        run_dir(run_storage, run_name),
        config="${{inputs.config}}",
        nnodes=nnodes,
        max_restarts=max_restarts,
        gpus_per_node=gpus_per_node,
        sets=sets,
        tensorboard_link=TENSORBOARD_LINK if run_storage == "datastore" else "",
    )


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

    return AmlCompute(
        name=name,
        size=sku.name,
        min_instances=min_nodes,
        max_instances=max_nodes,
        idle_time_before_scale_down=idle_seconds,
        tier="low_priority" if low_priority else "dedicated",
    )


def environment_version(image: str, conda_file: Path) -> str:
    """A content version: the same image and environment.yml give the same version, so creating it again is a
    no-op, and any change gets a new version instead of failing on an immutable one."""
    return hashlib.sha256(image.encode() + b"\0" + conda_file.read_bytes()).hexdigest()[:12]


def environment(
    image: str,
    conda_file: Path,
    *,
    name: str = ENVIRONMENT_NAME,
    description: str = "Trainbook: Azure Container for PyTorch + the project's environment.yml",
):
    """The Environment: an image (ACPT for training) with the project's conda environment on top."""
    from azure.ai.ml.entities import Environment

    return Environment(
        name=name,
        version=environment_version(image, conda_file),
        image=image,
        conda_file=str(conda_file),
        description=description,
    )


def data(asset):
    """The Data asset mirroring a local one: same name, version and type; the local snapshot is the upload."""
    from azure.ai.ml.entities import Data

    tags = {"sha256": asset.sha256, "size_bytes": str(asset.size_bytes), "file_count": str(asset.file_count)}
    return Data(
        name=asset.name,
        version=str(asset.version),
        type=asset.type,
        path=str(asset.path),
        description=asset.description or f"Trainbook data asset {asset.ref}",
        tags={**asset.tags, **tags},
    )


def services(names, *, run_storage: str, ssh_public_keys: str = "") -> dict:
    """The job's interactive services by name (a subset of SERVICES). JupyterLab, VS Code and SSH reach every node
    (a hang is often on one of them); TensorBoard runs on node 0, whose rank 0 writes the scalars."""
    from azure.ai.ml.entities import JupyterLabJobService, SshJobService, TensorBoardJobService, VsCodeJobService

    log_dir = f"{LOCAL_RUN_DIR}/tb" if run_storage == "local" else TENSORBOARD_LINK
    build = {
        "jupyterlab": lambda: JupyterLabJobService(nodes="all"),
        "vscode": lambda: VsCodeJobService(nodes="all"),
        "tensorboard": lambda: TensorBoardJobService(log_dir=log_dir),
        "ssh": lambda: SshJobService(ssh_public_keys=ssh_public_keys, nodes="all"),
    }
    return {name: build[name]() for name in SERVICES if name in names}


def job(
    cfg,
    *,
    compute_name: str,
    sku: Sku,
    environment_ref: str,
    code: Path,
    instance_count: int,
    processes_per_node: int,
    config_path: str,
    run_name: str,
    run_storage: str,
    datastore: str,
    max_restarts: int,
    elastic_min_nodes: int | None = None,
    services: dict,
    data_asset=None,
    folders: dict[str, tuple[str, str]] | None = None,
):
    """The CommandJob: ``python -m toolkit.runs.job`` once per node under PyTorchDistribution (one process per
    node, which starts the node's ranks itself and restarts them from the last checkpoint).

    DeepSpeed configs run the same way: its ranks get RANK/WORLD_SIZE/MASTER_ADDR from torchrun and
    deepspeed.init_distributed reads them, so no SSH, hostfile or MPI launcher is involved. ``folders``: input
    name -> (local folder, uploaded with the job; the config field set to where the job mounts it).
    """
    from azure.ai.ml import Input, Output, PyTorchDistribution
    from azure.ai.ml.entities import CommandJob, JobResourceConfiguration

    inputs = {"config": Input(type="uri_file", path=config_path)}
    if data_asset is not None:
        inputs["data"] = Input(
            type=data_asset.type, path=f"azureml:{data_asset.name}:{data_asset.version}", mode="ro_mount"
        )
    for name, (path, _) in (folders or {}).items():
        inputs[name] = Input(type="uri_folder", path=path, mode="ro_mount")
    outputs = (
        {RUNS_OUTPUT: Output(type="uri_folder", mode="rw_mount", path=runs_uri(datastore))}
        if run_storage == "datastore"
        else {}
    )
    world = instance_count * processes_per_node
    return CommandJob(
        command=command(
            run_storage,
            run_name,
            nnodes=f"{elastic_min_nodes}:{instance_count}" if elastic_min_nodes else instance_count,
            max_restarts=max_restarts,
            gpus_per_node=processes_per_node if sku.gpus else 0,
            with_data=data_asset is not None,
            mounted={name: field for name, (_, field) in (folders or {}).items()},
        ),
        code=str(code),
        compute=compute_name,
        environment=environment_ref,
        distribution=PyTorchDistribution(process_count_per_instance=1),
        resources=JobResourceConfiguration(instance_count=instance_count, shm_size=shm_size(sku)),
        environment_variables=environment_variables(sku),
        inputs=inputs,
        outputs=outputs,
        services=services,
        experiment_name=EXPERIMENT_NAME,
        display_name=run_name,
        description=f"Trainbook {cfg.name}: {cfg.engine.name} on {instance_count} x {sku.name}, world size {world}",
        tags={
            "trainbook_config_sha256": cfg.fingerprint(),
            "engine": cfg.engine.name,
            "world_size": str(world),
            "run_name": run_name,
            **({"data": f"{data_asset.name}:{data_asset.version}"} if data_asset is not None else {}),
        },
    )


# --- online endpoint -------------------------------------------------------------------------------------------
# The Azure ML twin of the local online endpoint: the same toolkit/deploy/serving/score.py (init/run) behind Azure ML's
# inference server, with the same batching knobs.

# Azure ML's minimal CPU inference image ("Docker images for inference", learn.microsoft.com/azure/machine-learning/
# concept-prebuilt-docker-images-inference, "Inference minimal base images"; Microsoft recommends `:latest`, which
# follows its patched rebuilds). Its own Python does not matter: Azure ML builds environment.yml (python 3.11,
# azureml-inference-server-http, onnxruntime, torch) into a conda environment on top and runs score.py there.
# GPU sizes serve from the ACPT image (CUDA, cuDNN and NCCL built with PyTorch), like training.
CPU_INFERENCE_IMAGE = "mcr.microsoft.com/azureml/minimal-ubuntu22.04-py39-cpu-inference:latest"
SERVING_ENVIRONMENT_NAME = "trainbook-serving"
SCORING_SCRIPT = "toolkit/deploy/serving/score.py"  # relative to the code folder (the project root)
# One inference-server worker process with this many threads: concurrent requests land in the same process, where
# score.py gathers them into batches (one model in memory, not one per worker).
SERVER_THREADS = 16
# A request waits at most --max-wait-ms for its batch, then runs with up to --max-batch - 1 others; 10 s leaves
# room for a full batch on a small CPU size and a cold first call, far below Azure's 180 s maximum.
REQUEST_TIMEOUT_MS = 10_000
# Deprecated by Azure in favour of request_timeout_ms, still honoured by older API versions: the SDK default.
MAX_QUEUE_WAIT_MS = 500
# Probes (seconds). The inference server answers once score.py's init() has loaded the model: a few seconds for
# an ONNX session or safetensors weights, longer on a small CPU size. Readiness polls quickly so traffic starts
# soon after the load, and keeps trying for 10 + 60 x 5 s. Liveness starts later and tolerates 30 misses 10 s
# apart before Azure restarts the container, so a slow load is never killed mid-way. Timeouts of 5 s: with all
# threads busy in a batch, a probe waits its turn. Azure fixes a liveness probe's success threshold at 1.
READINESS_PROBE = {"initial_delay": 10, "period": 5, "timeout": 5, "failure_threshold": 60, "success_threshold": 1}
LIVENESS_PROBE = {"initial_delay": 30, "period": 10, "timeout": 5, "failure_threshold": 30, "success_threshold": 1}


def serving_image(sku: Sku) -> str:
    """The default image for a serving size: ACPT on GPU sizes, the minimal CPU inference image elsewhere."""
    return DEFAULT_IMAGE if sku.gpus else CPU_INFERENCE_IMAGE


def online_endpoint(name: str, *, description: str, tags: dict[str, str]):
    """The ManagedOnlineEndpoint: key authentication, like the local endpoint."""
    from azure.ai.ml.entities import ManagedOnlineEndpoint

    return ManagedOnlineEndpoint(name=name, auth_mode="key", description=description, tags=tags)


def model(path: Path, *, name: str, version: str | None, description: str, tags: dict[str, str]):
    """The Model: the exported folder, uploaded as it is (a custom_model). Without a version Azure ML gives the
    next free one."""
    from azure.ai.ml.entities import Model

    return Model(path=str(path), type="custom_model", name=name, version=version, description=description, tags=tags)


def online_deployment(
    name: str,
    *,
    endpoint_name: str,
    model_entity,
    code: Path,
    environment_entity,
    sku: Sku,
    instance_count: int,
    variables: dict[str, str],
    tags: dict[str, str],
):
    """The ManagedOnlineDeployment: score.py from the project folder, the model, probes and request settings."""
    from azure.ai.ml.entities import CodeConfiguration, ManagedOnlineDeployment, OnlineRequestSettings, ProbeSettings

    return ManagedOnlineDeployment(
        name=name,
        endpoint_name=endpoint_name,
        model=model_entity,
        code_configuration=CodeConfiguration(code=str(code), scoring_script=SCORING_SCRIPT),
        environment=environment_entity,
        instance_type=sku.name,
        instance_count=instance_count,
        liveness_probe=ProbeSettings(**LIVENESS_PROBE),
        readiness_probe=ProbeSettings(**READINESS_PROBE),
        request_settings=OnlineRequestSettings(
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            max_concurrent_requests_per_instance=SERVER_THREADS,
            max_queue_wait_ms=MAX_QUEUE_WAIT_MS,
        ),
        environment_variables=variables,
        tags=tags,
        description=f"Trainbook {model_entity.name} on {instance_count} x {sku.name}",
    )
