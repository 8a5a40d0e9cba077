"""Plan an Azure ML training job: validate what the SDK does not, build the entities, write them as a folder.

    plan = build_plan(cfg, compute="gpu-a100", sku="Standard_ND96asr_v4", instance_count=2)
    write_plan(plan, "plans/tiny")   # compute.yaml environment.yaml environment.yml data.yaml job.yaml
                                     # trainbook-config.yaml submit.md

The job runs ``toolkit.runs.job`` once per node, with its run directory on a datastore (a read-write mounted output,
named after the run), so a retried or resubmitted job resumes it and a crashed rank is restarted inside the job.

Everything is checked before anything is written, and the folder is assembled next to its destination and
renamed into place, so a failed plan leaves nothing behind and a replaced plan is never half old, half new.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Sequence

from toolkit.azure import code_upload, entities
from toolkit.azure.connection import WorkspaceRef
from toolkit.azure.errors import AzureError
from toolkit.azure.plan_files import (
    CONDA_COPY,
    az_account_line,
    az_flags,
    environment_dict,
    image_ok,
    plain,
    publish,
    read_conda_file,
    trainbook_command,
    yaml_text,
)
from toolkit.azure.skus import Sku, get_sku
from toolkit.errors import not_allowed, refused
from toolkit.names import name_problem
from toolkit.train.engines import check_engine
from toolkit.deepspeed_config import get_path as _get

DEFAULT_IDLE_SECONDS = 1800
DEFAULT_MAX_RESTARTS = 3  # restarts of the ranks inside one job, from the last checkpoint
RUN_STORAGES = ("datastore", "local")
# Azure ML datastore names: letters, digits and '_' (Azure's quickstart templates, "Create an Azure Machine Learning
# datastore": "can only contain alphanumeric characters and underscore").
DATASTORE_RE = re.compile(r"[A-Za-z0-9_]{1,255}")
# OpenSSH public key types (ssh-keygen -t ...); DSA keys are refused by current OpenSSH servers.
SSH_KEY_TYPES = frozenset(
    {
        "ssh-ed25519",
        "ssh-rsa",
        "ecdsa-sha2-nistp256",
        "ecdsa-sha2-nistp384",
        "ecdsa-sha2-nistp521",
        "sk-ssh-ed25519@openssh.com",
        "sk-ecdsa-sha2-nistp256@openssh.com",
    }
)
SSH_KEY_FILE_LIMIT = 64 << 10
# Azure ML compute cluster names: 3 to 24 letters, digits and '-', starting with a letter, and a '-' must be
# followed by a letter somewhere later (learn.microsoft.com, "Create compute targets ... studio": Compute name).
COMPUTE_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]{2,23}")
SCHEMAS = {
    "compute.yaml": "amlCompute.schema.json",
    "environment.yaml": "environment.schema.json",
    "data.yaml": "data.schema.json",
    "job.yaml": "commandJob.schema.json",
}


@dataclass(frozen=True)
class Options:
    """The plan's knobs as given (flags or keyword arguments)."""

    compute: str
    instance_count: int
    gpus_per_node: int | None
    min_nodes: int
    max_nodes: int
    idle_seconds: int
    low_priority: bool
    image: str
    run_name: str
    datastore: str
    run_storage: str
    max_restarts: int
    services: tuple[str, ...]
    ssh_public_key: str | None  # a file path
    elastic_min_nodes: int | None = None
    """An elastic job: training starts once this many of the instance_count nodes are up (toolkit.runs.job)."""


def _compute_name_ok(name: str) -> bool:
    return bool(COMPUTE_NAME_RE.fullmatch(name)) and (
        "-" not in name or re.search(r"[A-Za-z]", name.rsplit("-", 1)[1]) is not None
    )


# Checks of the options alone, in the order a person reads the flags: (is it wrong?, what to say).
OPTION_RULES: list[tuple[Callable[[Options], bool], Callable[[Options], str]]] = [
    (
        lambda o: not _compute_name_ok(o.compute),
        lambda o: not_allowed(
            "--compute",
            o.compute,
            "3 to 24 letters, digits and '-', starting with a letter, with a letter after the last '-'",
        ),
    ),
    (lambda o: o.instance_count < 1, lambda o: not_allowed("--instance-count", o.instance_count, "1 or more")),
    (
        lambda o: o.gpus_per_node is not None and o.gpus_per_node < 1,
        lambda o: not_allowed("--gpus-per-node", o.gpus_per_node, "1 or more"),
    ),
    (lambda o: o.min_nodes < 0, lambda o: not_allowed("--min-nodes", o.min_nodes, "0 or more")),
    (lambda o: o.max_nodes < 1, lambda o: not_allowed("--max-nodes", o.max_nodes, "1 or more")),
    (
        lambda o: o.min_nodes > o.max_nodes,
        lambda o: not_allowed(
            "--min-nodes", o.min_nodes, f"0 to {o.max_nodes}", problem=f"is above --max-nodes={o.max_nodes}"
        ),
    ),
    (
        lambda o: o.instance_count > o.max_nodes,
        lambda o: not_allowed(
            "--instance-count",
            o.instance_count,
            f"1 to {o.max_nodes} (the cluster never grows past --max-nodes, the job would wait forever)",
            problem=f"is above --max-nodes={o.max_nodes}",
        ),
    ),
    (lambda o: o.idle_seconds < 0, lambda o: not_allowed("--idle-seconds", o.idle_seconds, "0 or more")),
    (
        lambda o: not image_ok(o.image),
        lambda o: not_allowed("--image", o.image, f"an image reference like {entities.DEFAULT_IMAGE}"),
    ),
    (
        lambda o: name_problem("--run-name", o.run_name) is not None,
        lambda o: name_problem("--run-name", o.run_name) + " (it names the run's folder on the datastore)",
    ),
    (
        lambda o: not (isinstance(o.datastore, str) and DATASTORE_RE.fullmatch(o.datastore)),
        lambda o: not_allowed(
            "--datastore",
            o.datastore,
            f"letters, digits and '_' (an Azure ML datastore name, e.g. {entities.DEFAULT_DATASTORE})",
        ),
    ),
    (
        lambda o: o.run_storage not in RUN_STORAGES,
        lambda o: not_allowed("--run-storage", o.run_storage, " or ".join(RUN_STORAGES)),
    ),
    (
        lambda o: o.run_storage == "local" and o.low_priority,
        lambda o: not_allowed(
            "--run-storage",
            o.run_storage,
            "datastore (the default) with --low-priority",
            problem="is not allowed with --low-priority, as a preempted job could never resume "
            "(its checkpoints stay on the node that was taken away)",
        ),
    ),
    (
        lambda o: o.run_storage == "local" and o.instance_count > 1,
        lambda o: not_allowed(
            "--run-storage",
            o.run_storage,
            "datastore (the default) on more than one node",
            problem=f"is not allowed with --instance-count {o.instance_count}, as the other "
            "nodes' checkpoint shards would never reach node 0's outputs",
        ),
    ),
    (lambda o: o.max_restarts < 0, lambda o: not_allowed("--max-restarts", o.max_restarts, "0 or more")),
    (
        lambda o: o.elastic_min_nodes is not None and not 1 <= o.elastic_min_nodes <= o.instance_count,
        lambda o: not_allowed(
            "--elastic-min-nodes", o.elastic_min_nodes, f"1 to --instance-count ({o.instance_count})"
        ),
    ),
    (
        lambda o: o.elastic_min_nodes is not None and o.run_storage == "local",
        lambda o: not_allowed(
            "--run-storage",
            o.run_storage,
            "datastore (the default) with --elastic-min-nodes",
            problem="is not allowed with --elastic-min-nodes, as the nodes resume from each other's checkpoints",
        ),
    ),
    (
        lambda o: not set(o.services) <= set(entities.SERVICES),
        lambda o: not_allowed(
            "--services",
            ",".join(o.services),
            f"a comma-separated list of {', '.join(entities.SERVICES)}",
            problem=f"names {', '.join(x for x in o.services if x not in entities.SERVICES)!r}, which is not a service",
        ),
    ),
    (
        lambda o: "ssh" in o.services and not o.ssh_public_key,
        lambda o: refused(
            "--services",
            "ssh needs --ssh-public-key FILE",
            "--ssh-public-key with your public key file, e.g. ~/.ssh/id_ed25519.pub",
        ),
    ),
    (
        lambda o: "ssh" not in o.services and o.ssh_public_key,
        lambda o: not_allowed(
            "--ssh-public-key",
            o.ssh_public_key,
            "leave it out, or add ssh to --services",
            problem="is given without ssh in --services",
        ),
    ),
]


def _ssh_public_keys(path: str) -> str:
    """The public keys of ``path`` (one per line), checked: a private key is refused without being repeated, so the
    job (and its YAML, which anyone with the workspace can read) only ever carries public halves."""
    field = "--ssh-public-key"
    allowed = "an OpenSSH public key file, one 'ssh-ed25519 AAAA... comment' line per key (e.g. ~/.ssh/id_ed25519.pub)"
    file = Path(path).expanduser()
    try:
        if not file.is_file():
            raise AzureError(
                not_allowed(
                    field, path, allowed, problem="does not exist" if not file.exists() else "is not a regular file"
                )
            )
        if file.stat().st_size > SSH_KEY_FILE_LIMIT:
            raise AzureError(not_allowed(field, path, allowed, problem=f"is over {SSH_KEY_FILE_LIMIT:,} bytes"))
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AzureError(not_allowed(field, path, allowed, problem=f"cannot be read ({exc})")) from None
    if "PRIVATE KEY" in text or text.startswith("PuTTY-User-Key-File"):
        raise AzureError(
            not_allowed(
                field,
                path,
                "the public key beside it (the .pub file): a private key never leaves this machine",
                problem="is a private key",
            )
        )
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for number, key in enumerate(keys, 1):
        if not _is_public_key(key):
            raise AzureError(not_allowed(field, path, allowed, problem=f"line {number} is not an OpenSSH public key"))
    if not keys:
        raise AzureError(not_allowed(field, path, allowed, problem="holds no key"))
    return "\n".join(keys)


def _is_public_key(line: str) -> bool:
    """'TYPE BASE64 [comment]' whose decoded blob names the same TYPE first, as OpenSSH writes it."""
    kind, _, rest = line.partition(" ")
    if kind not in SSH_KEY_TYPES or not rest.split():
        return False
    try:
        blob = base64.b64decode(rest.split()[0], validate=True)
    except ValueError:
        return False
    length = int.from_bytes(blob[:4], "big")
    return blob[4 : 4 + length] == kind.encode()


def _processes_per_node(cfg, sku: Sku, options: Options) -> int:
    """One process per GPU by default. Fewer GPUs than the node has is allowed (a smaller test on a big node);
    more is not. CPU sizes run engine.nproc processes, at most one per vCPU."""
    if sku.gpus:
        wanted = options.gpus_per_node if options.gpus_per_node is not None else sku.gpus
        if wanted > sku.gpus:
            raise AzureError(
                not_allowed(
                    "--gpus-per-node",
                    wanted,
                    f"1 to {sku.gpus} (the GPUs of one node)",
                    problem=f"is not allowed on {sku.name}",
                )
            )
        return wanted
    if options.gpus_per_node is not None:
        raise AzureError(
            not_allowed(
                "--gpus-per-node",
                options.gpus_per_node,
                "leave it out (processes per node come from engine.nproc)",
                problem=f"is not allowed on {sku.name}, which has no GPUs",
            )
        )
    if cfg.engine.nproc > sku.vcpus:
        raise AzureError(
            not_allowed(
                "engine.nproc",
                cfg.engine.nproc,
                f"1 to {sku.vcpus} (one process per vCPU at most)",
                problem=f"is not allowed on {sku.name}",
            )
        )
    return cfg.engine.nproc


def _local_asset(cfg):
    """The registered asset the config names, or None. A local data.path is refused: the cluster cannot see it."""
    local_path = getattr(cfg.data, "path", "")
    if local_path:
        raise AzureError(
            not_allowed(
                "data.path",
                local_path,
                "register it (trainbook data register) and set data.asset instead",
                problem="is a path on this machine, which the cluster cannot read",
            )
        )
    if not cfg.data.asset:
        return None
    from toolkit.catalogue import data_assets, data_verify
    from toolkit.catalogue.workspace import Workspace, WorkspaceError

    try:
        ws = Workspace.open(cfg.data.workspace or None)
        asset = data_assets.open_asset(ws, cfg.data.asset)  # an older Trainbook's snapshot is upgraded here
    except (data_assets.DataAssetError, WorkspaceError) as exc:
        detail = str(exc).removeprefix("data asset: ")
        raise AzureError(f"data.asset: {detail}") from None
    # The snapshot goes up as it is on disk: its bytes must be the registered ones, or the job's lineage (which
    # hashes what it reads) would name different data than the catalogue.
    report = data_verify.verify(ws, asset.ref)
    if not report.ok:
        raise AzureError(
            refused(
                "data.asset",
                f"{asset.ref} does not match its registration ({report.problems[0]})",
                f"an asset that `trainbook data verify {asset.ref}` finds intact (try --repair)",
            )
        )
    return asset


@dataclass
class Plan:
    """A validated Azure ML plan: the options, what was checked, and the SDK entities built from them."""

    cfg: Any  # the config as given
    job_cfg: Any  # the config the job runs: data via the job's input, engine.nproc = processes per node
    sku: Sku
    options: Options
    processes_per_node: int
    conda_file: Path
    code: code_upload.CodeUpload
    model_code: code_upload.ModelCode | None  # the user's model code, uploaded as the job's model_code input
    asset: Any  # toolkit.catalogue.data_assets.DataAsset or None
    workspace: WorkspaceRef | None
    compute: Any  # azure.ai.ml.entities.AmlCompute
    environment: Any  # azure.ai.ml.entities.Environment
    data: Any  # azure.ai.ml.entities.Data or None
    job: Any  # azure.ai.ml.entities.CommandJob
    deepspeed: dict | None = None  # what DeepSpeed will be handed on the cluster (None: the torch engine)
    forecast: Any = None  # toolkit.azure.forecast.ForecastReport of the job, or None (none asked for)

    @property
    def world_size(self) -> int:
        return self.options.instance_count * self.processes_per_node

    @property
    def run_location(self) -> str:
        """Where the job's run directory lives, as a person looks for it."""
        o = self.options
        if o.run_storage == "datastore":
            return entities.runs_uri(o.datastore, o.run_name)
        return f"{entities.LOCAL_RUN_DIR} in the job's outputs"

    def summary(self) -> str:
        """A short table of what was planned."""
        o = self.options
        engine = self.cfg.engine.name + (
            f", ZeRO stage {self.cfg.engine.zero_stage}" if self.cfg.engine.name == "deepspeed" else ""
        )
        offload = [
            f"{part} to {device}"
            for part, device in (
                ("optimizer state", _get(self.deepspeed or {}, "zero_optimization.offload_optimizer.device", None)),
                ("parameters", _get(self.deepspeed or {}, "zero_optimization.offload_param.device", None)),
            )
            if device not in (None, "none")
        ]
        if offload:
            engine += ", offload " + " and ".join(offload)
        per = "GPUs" if self.sku.gpus else "processes"
        data = (
            f"{self.asset.ref} ({self.asset.type}, {self.asset.size_bytes:,} bytes, sha256 {self.asset.sha256[:12]})"
            if self.asset
            else "none (the config's built-in dataset)"
        )
        rows = [
            (
                "compute",
                f"{o.compute}: {self.sku.describe()}; {o.min_nodes} to {o.max_nodes} nodes, "
                f"{'low priority' if o.low_priority else 'dedicated'}, idle {o.idle_seconds} s",
            ),
            (
                "job",
                f"{o.instance_count} node(s) x {self.processes_per_node} {per} = world size {self.world_size} "
                f"({engine}, {self.cfg.engine.precision})",
            ),
            (
                "image",
                f"{o.image} + {self.conda_file.name} (environment {self.environment.name}:{self.environment.version})",
            ),
            ("data", data),
            (
                "run",
                self.run_location
                + (
                    f" (shared by the nodes; submitting this plan again resumes it); up to {o.max_restarts} "
                    "restart(s) inside the job"
                    if o.run_storage == "datastore"
                    else f" (node-local, uploaded when the job ends: a quick try); up to {o.max_restarts} restart(s) "
                    "inside the job"
                ),
            ),
            ("services", ", ".join(self.job.services or {}) or "none"),
            ("code upload", self.code.describe()),
            *([("model code", self.model_code.describe())] if self.model_code else []),
            ("workspace", self.workspace.describe() if self.workspace else "not given (placeholders in submit.md)"),
        ]
        return "\n".join(f"{name:<12} {value}" for name, value in rows)


def build_plan(
    cfg,
    *,
    compute: str,
    sku: str,
    instance_count: int,
    gpus_per_node: int | None = None,
    min_nodes: int = 0,
    max_nodes: int | None = None,
    idle_seconds: int = DEFAULT_IDLE_SECONDS,
    low_priority: bool = False,
    image: str | None = None,
    workspace: WorkspaceRef | None = None,
    conda_file: str | Path | None = None,
    project_root: str | Path | None = None,
    code_limit_bytes: int = code_upload.SNAPSHOT_LIMIT_BYTES,
    code_limit_files: int = code_upload.SNAPSHOT_LIMIT_FILES,
    run_name: str | None = None,
    datastore: str = entities.DEFAULT_DATASTORE,
    run_storage: str = "datastore",
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    services: Sequence[str] | str = ("tensorboard",),
    ssh_public_key: str | Path | None = None,
    elastic_min_nodes: int | None = None,
) -> Plan:
    """Validate everything (options, size, data asset, environment.yml, code upload) and build the entities.
    ``run_name`` (default: the config's name) names the run's folder on ``datastore``: planning and submitting again
    under the same name resumes the run. ``services``: names of entities.SERVICES (a list, or 'a,b').
    ``elastic_min_nodes``: an elastic job (data.sampling=epochs), training from this many nodes up."""
    from toolkit.paths import PROJECT_ROOT

    if max_nodes is None:  # room for the job, and never below the nodes kept warm
        max_nodes = max(instance_count, min_nodes, 1)
    options = Options(
        compute=str(compute),
        instance_count=instance_count,
        gpus_per_node=gpus_per_node,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        idle_seconds=idle_seconds,
        low_priority=low_priority,
        image=image or entities.DEFAULT_IMAGE,
        run_name=cfg.name if run_name is None else run_name,
        datastore=datastore,
        run_storage=run_storage,
        max_restarts=max_restarts,
        services=tuple(name.strip() for name in services.split(",") if name.strip())
        if isinstance(services, str)
        else tuple(services),
        ssh_public_key=None if ssh_public_key is None else str(ssh_public_key),
        elastic_min_nodes=elastic_min_nodes,
    )
    for wrong, message in OPTION_RULES:
        if wrong(options):
            raise AzureError(message(options))
    ssh_keys = _ssh_public_keys(options.ssh_public_key) if options.ssh_public_key else ""
    the_sku = get_sku(sku)
    processes = _processes_per_node(cfg, the_sku, options)
    asset = _local_asset(cfg)
    root = Path(project_root or PROJECT_ROOT).resolve()
    upload = code_upload.scan(root)
    code_upload.check(upload, code_limit_bytes, code_limit_files)
    conda = Path(conda_file).expanduser().resolve() if conda_file is not None else root / "environment.yml"
    read_conda_file(conda)

    job_model, model_code, folders = _job_model(cfg, code_limit_bytes, code_limit_files)
    # a DeepSpeed file travels as the copy in engine.deepspeed: its local path means nothing on the cluster
    job_cfg = dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, asset="", workspace=""),
        engine=dataclasses.replace(cfg.engine, nproc=processes, deepspeed_config=""),
        model=job_model,
    )
    # fp16, offload and a user's DeepSpeed file checked for the SKU's devices and the job's world, as a launch on
    # that machine would: a GPU SKU takes ZeRO-Offload and fp16, a CPU one refuses them here, before any upload
    deepspeed = check_engine(
        job_cfg, world=options.instance_count * processes, cuda=the_sku.gpus > 0, per_node=processes
    )
    if options.elastic_min_nodes is not None and job_cfg.data.sampling != "epochs":
        raise AzureError(
            not_allowed(
                "data.sampling",
                job_cfg.data.sampling,
                "'epochs' with --elastic-min-nodes",
                problem="draws each step's rows by step and replica, so a change of nodes would repeat or skip data",
            )
        )
    environment = entities.environment(options.image, conda)
    return Plan(
        cfg=cfg,
        job_cfg=job_cfg,
        sku=the_sku,
        options=options,
        processes_per_node=processes,
        conda_file=conda,
        deepspeed=deepspeed,
        code=upload,
        model_code=model_code,
        asset=asset,
        workspace=workspace,
        compute=entities.compute(
            options.compute, the_sku, options.min_nodes, options.max_nodes, options.idle_seconds, options.low_priority
        ),
        environment=environment,
        data=entities.data(asset) if asset is not None else None,
        job=entities.job(
            job_cfg,
            compute_name=options.compute,
            sku=the_sku,
            code=root,
            environment_ref=f"azureml:{environment.name}:{environment.version}",
            instance_count=options.instance_count,
            processes_per_node=processes,
            config_path=f"./{entities.CONFIG_INPUT}",
            run_name=options.run_name,
            run_storage=options.run_storage,
            datastore=options.datastore,
            max_restarts=options.max_restarts,
            elastic_min_nodes=options.elastic_min_nodes,
            services=entities.services(options.services, run_storage=options.run_storage, ssh_public_keys=ssh_keys),
            data_asset=asset,
            folders=folders,
        ),
    )


def _job_model(cfg, limit_bytes: int, limit_files: int):
    """(the model section the job runs, the model code it uploads or None, the folders it uploads as inputs: name
    -> (path, the config field the command points at the mounted copy)). The cluster sees none of this machine's
    paths: a custom model's code goes up as the model_code input (copied into the plan; the job's model.factory and
    model.loss name the copies, file paths relative to the mount), a model.hf.source or model.init_from folder as
    an input of its own, uploaded from where it is (its weights checked first: safetensors, no link)."""
    from toolkit.catalogue.pretrained import open_weights
    from toolkit.train.models import hf
    from toolkit.train.models.preflight import pin_model

    try:
        pinned = pin_model(cfg).model  # absolute paths, module roots, registered models as their snapshot folder
        if pinned.name == "hf" and pinned.hf.source:
            hf.check_source(pinned)
        if pinned.init_from:
            open_weights(pinned.init_from)
    except ValueError as exc:  # ModelImportError, PretrainedError, ExportError: all name their field
        raise AzureError(str(exc)) from None
    folders = {}
    if pinned.name == "hf" and Path(pinned.hf.source).is_absolute():
        folders["hf_source"] = (pinned.hf.source, "model.hf.source")
    if pinned.init_from:
        folders["init_from"] = (pinned.init_from, "model.init_from")
    code = code_upload.model_code(pinned, limit_bytes, limit_files)
    if code is not None:
        folders["model_code"] = (f"./{code_upload.MODEL_CODE}", "model.code_path")
        pinned = dataclasses.replace(pinned, factory=code.factory, loss=code.loss)
    return dataclasses.replace(pinned, code_path=""), code, folders


# --- writing ---------------------------------------------------------------------------------------------------


def _job_dict(plan: Plan) -> dict:
    content = plain(plan.job._to_dict())
    # azure-ai-ml 1.35.2 dumps every input path with an "azureml:" prefix, which turns a local file into a
    # reference to an asset that does not exist; local inputs keep the path they were given.
    for name, given in plan.job.inputs.items():
        path = getattr(given, "path", None) or getattr(getattr(given, "_data", None), "path", None)
        if isinstance(path, str) and not path.startswith("azureml:"):
            content["inputs"][name]["path"] = path
    return content


def _yaml(name: str, content: dict, create: str) -> str:
    return yaml_text(SCHEMAS[name], content, verb="plan", create=create)


def _forecast_md(plan: Plan) -> str:
    """The job's forecast (time, cost, failures), for the reviewer; nothing when none was asked for."""
    if plan.forecast is None:
        return ""
    report = plan.forecast
    lines = "\n".join(f"- {line}" for line in report.sources())
    return f"""## Forecast (`trainbook forecast`)

```
{report.table()}
```

{lines}

"""


def _submit_md(plan: Plan, out: Path) -> str:
    flags = az_flags(plan.workspace)
    sub = az_account_line(plan.workspace)
    data_step = f"az ml data create -f data.yaml {flags}\n" if plan.data is not None else ""
    trainbook = trainbook_command("submit", out, plan.workspace)
    return f"""# Azure ML plan: {plan.cfg.name}

```
{plan.summary()}
```

## Submit with the Azure CLI (`az extension add -n ml`)

Run from this folder: the YAML files name their neighbours (environment.yml, trainbook-config.yaml) relatively.

```
cd {out}
{sub}
az ml compute create -f compute.yaml {flags}
az ml environment create -f environment.yaml {flags}
{data_step}az ml job create -f job.yaml --stream {flags}
```

## Or with Trainbook (the same four steps, then it streams the log)

```
{trainbook}
```

{_forecast_md(plan)}## What runs

- Each of the {plan.options.instance_count} node(s) runs this once (Azure ML's PyTorch distribution, one process per
  node, sets MASTER_ADDR, MASTER_PORT and NODE_RANK):
  `{plan.job.command}`
- That entry checks the node first (run storage writable, disk, /dev/shm, GPUs, then an all-reduce across the
  nodes) and fails the job with its report instead of hanging; then torchrun starts the node's
  {plan.processes_per_node} rank(s) (world size {plan.world_size}) under the supervisor, which restarts them from the
  last checkpoint up to {plan.options.max_restarts} time(s) when a rank dies.
- DeepSpeed configs run the same way: `deepspeed.init_distributed` reads torchrun's variables,
  so no SSH, hostfile or MPI launcher is needed.
- The code upload is {plan.code.describe()}.
- The environment installs environment.yml: every package pinned to constraints.txt, as `make setup` installs them.
  Re-creating it is a no-op: its version ({plan.environment.version}) is a hash of the image and environment.yml.

## Where the run lives

{_run_storage_md(plan)}

## Services

{_services_md(plan)}
"""


def _run_storage_md(plan: Plan) -> str:
    o = plan.options
    if o.run_storage == "local":
        return (
            f"`{entities.LOCAL_RUN_DIR}` on the node (--run-storage local): Azure ML uploads `outputs/` as the "
            "job's artifacts when the job ends. A quick single-node try: a job that fails or is stopped takes "
            "its checkpoints with it, and submitting the plan again starts from step 0."
        )
    return f"""`{plan.run_location}` on datastore {o.datastore}:
the job's `{entities.RUNS_OUTPUT}` output, mounted read-write on every node, holds the run directory `{o.run_name}`
(checkpoints, events, status, TensorBoard scalars).

- **Submitting this plan again resumes the run** from its last complete checkpoint (`az ml job create -f job.yaml`
  or `trainbook azure submit` again): the run is found by its name, `--run-name {o.run_name}`.
- A different config under the same run name is refused when the job starts, naming the first field that differs.
  Plan with another `--run-name` to start a new run.
- Preemption: azure-ai-ml has no retry setting for command jobs (`retry_settings` exists for parallel jobs only).
  On low-priority nodes Azure ML itself requeues a preempted job, which then resumes from the datastore; a job that
  ends failed instead is resumed by submitting the plan again.
- {_elastic_md(o)}"""


def _elastic_md(o: Options) -> str:
    if o.elastic_min_nodes is None:
        hint = " (`--elastic-min-nodes`, with `data.sampling: epochs`)" if o.low_priority else ""
        return f"Fixed nodes: the job trains on all {o.instance_count} or none{hint}."
    return (
        f"Elastic (`--elastic-min-nodes {o.elastic_min_nodes}`): each node runs `--nnodes "
        f"{o.elastic_min_nodes}:{o.instance_count}`; training starts once {o.elastic_min_nodes} node(s) have met on "
        f"node 0 and takes in the others as they come up, and a node lost goes on without it while "
        f"{o.elastic_min_nodes} remain. At each change the ranks checkpoint and start again at the new world size, "
        "the data position kept (`data.sampling: epochs`). Node 0 holds the rendezvous: losing it ends the job, which "
        "submitting the plan again resumes."
    )


def _services_md(plan: Plan) -> str:
    if not plan.job.services:
        return "None (--services): follow the job with `az ml job stream` or the studio's logs."
    lines = [f"- {name}" for name in plan.job.services]
    return (
        "\n".join(lines)
        + f"""

Open them from the job's page in the studio (Debug and monitor) or list their URLs with
`az ml job show-services --name <job name> --node-index 0 {az_flags(plan.workspace)}`; SSH connects with
`az ml job connect-ssh --name <job name> --node-index 0 --private-key-file-path <your private key>`. JupyterLab, VS Code
and SSH run on every node, TensorBoard on node 0. They need openssh-server and Jupyter in the image: the ACPT curated
images have them. Only the job's owner can open them."""
    )


def _files(plan: Plan, out: Path) -> dict[str, str]:
    """File name -> text, everything a plan folder holds except the copied conda file."""
    flags = az_flags(plan.workspace)
    files = {
        entities.CONFIG_INPUT: plan.job_cfg.to_yaml(),
        "compute.yaml": _yaml(
            "compute.yaml", plain(plan.compute._to_dict()), f"az ml compute create -f compute.yaml {flags}"
        ),
        "environment.yaml": _yaml(
            "environment.yaml",
            environment_dict(plan.environment),
            f"az ml environment create -f environment.yaml {flags}",
        ),
        "job.yaml": _yaml("job.yaml", _job_dict(plan), f"az ml job create -f job.yaml --stream {flags}"),
        "submit.md": _submit_md(plan, out),
    }
    if plan.deepspeed is not None:  # for review; the job itself merges the same from its config (engine.deepspeed)
        files[DEEPSPEED_FILE] = json.dumps(plan.deepspeed, indent=1) + "\n"
    if plan.data is not None:
        files["data.yaml"] = _yaml("data.yaml", plain(plan.data._to_dict()), f"az ml data create -f data.yaml {flags}")
    return files


def sdk_loaders() -> dict:
    """Plan file name -> the azure-ai-ml loader that reads it."""
    from azure.ai.ml import load_compute, load_data, load_environment, load_job

    return {
        "compute.yaml": load_compute,
        "environment.yaml": load_environment,
        "data.yaml": load_data,
        "job.yaml": load_job,
    }


# Every file a plan folder may hold (data.yaml only when the job has a data input): what an earlier plan is.
DEEPSPEED_FILE = "deepspeed_config.json"
PLAN_FILES = frozenset(
    {
        "compute.yaml",
        "environment.yaml",
        "data.yaml",
        "job.yaml",
        "submit.md",
        CONDA_COPY,
        entities.CONFIG_INPUT,
        DEEPSPEED_FILE,
    }
)


def write_plan(plan: Plan, out_dir: str | Path) -> Path:
    """Write the plan folder; returns its path. An earlier plan there is replaced as a whole."""
    out = Path(out_dir).expanduser().absolute()
    copies = {CONDA_COPY: plan.conda_file}
    if plan.model_code:
        copies.update({f"{code_upload.MODEL_CODE}/{rel}": source for rel, source in plan.model_code.files})
    return publish(
        out,
        files=_files(plan, out),
        copies=copies,
        loaders=sdk_loaders(),
        marker="job.yaml",
        kind="plan",
        may_hold=PLAN_FILES,
        subfolders=frozenset({code_upload.MODEL_CODE}),
    )
