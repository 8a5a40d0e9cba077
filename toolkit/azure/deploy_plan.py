"""Plan an Azure ML managed online endpoint for an exported model: the twin of the local online endpoint.

    plan = build_deployment_plan("runs/demo/model", endpoint="trainbook-demo", sku="Standard_DS3_v2")
    write_deployment_plan(plan, "plans/serve")   # endpoint.yaml deployment.yaml environment.yml deploy.md

The deployment runs the project's own toolkit/deploy/serving/score.py (the scoring script of the local endpoint) behind
Azure ML's inference server, one worker with SERVER_THREADS threads, so concurrent requests reach one process and
score.py batches them (TRAINBOOK_MAX_BATCH, TRAINBOOK_MAX_WAIT_MS). Everything is checked before anything is
written; the folder is published atomically (see plan_files.publish).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

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
from toolkit.azure.skus import Sku, get_online_sku
from toolkit.catalogue.model_format import MANIFEST, ExportError, read_manifest, verify_model_folder
from toolkit.deploy.serving.options import WEIGHTS, ServingOptions, ServingOptionsError
from toolkit.errors import bounded_repr, not_allowed, refused

# Online endpoint and deployment names: 3 to 32 letters, digits and '-', starting with a letter and not ending
# with '-' (learn.microsoft.com, "Manage and increase quotas ... for Azure Machine Learning": managed online
# endpoints; azure-ai-ml's EndpointConfigurations.NAME_REGEX_PATTERN says the same).
ONLINE_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9-]{1,30}[A-Za-z0-9]")
NAME_RULE = "3 to 32 letters, digits and '-', starting with a letter and ending with a letter or digit"
INFERENCE_SERVER = "azureml-inference-server-http"  # runs score.py in the container; environment.yml must have it
SCHEMAS = {
    "endpoint.yaml": "managedOnlineEndpoint.schema.json",
    "deployment.yaml": "managedOnlineDeployment.schema.json",
}
MODEL_WHAT = (
    f"a model folder exported by Trainbook ({MANIFEST}, model.onnx, model.safetensors, tokenizer.json, config.yaml)"
)


@dataclass(frozen=True)
class DeployOptions:
    """The deployment's knobs as given (flags or keyword arguments)."""

    endpoint: str
    deployment: str
    instance_count: int
    image: str | None


# Checks of the options alone, in the order a person reads the flags: (is it wrong?, what to say).
DEPLOY_RULES: list[tuple[Callable[[DeployOptions], bool], Callable[[DeployOptions], str]]] = [
    (lambda o: not ONLINE_NAME_RE.fullmatch(o.endpoint), lambda o: not_allowed("--endpoint", o.endpoint, NAME_RULE)),
    (
        lambda o: not ONLINE_NAME_RE.fullmatch(o.deployment),
        lambda o: not_allowed("--deployment", o.deployment, NAME_RULE),
    ),
    (lambda o: o.instance_count < 1, lambda o: not_allowed("--instance-count", o.instance_count, "1 or more")),
    (
        lambda o: o.image is not None and not image_ok(o.image),
        lambda o: not_allowed("--image", o.image, f"an image reference like {entities.CPU_INFERENCE_IMAGE}"),
    ),
]


# --- the model folder ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFolder:
    """An exported model folder and what its manifest (and the local registry, if it came from there) says."""

    path: Path
    manifest: dict
    name: str
    version: str | None  # None: not registered locally; Azure ML gives the next free version
    description: str
    runtime: str  # what serves it: the runtime asked for, or the folder's default

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}" if self.version else f"{self.name} (unregistered export)"

    @property
    def format(self) -> str:
        return str(self.manifest.get("format", "?"))

    def tags(self) -> dict[str, str]:
        """The manifest's lineage as Model tags: where the weights came from."""
        tags = {key: str(self.manifest[key]) for key in LINEAGE_TAGS if self.manifest.get(key) not in (None, "")}
        data = self.manifest.get("data")
        if data:
            text = data if isinstance(data, str) else json.dumps(data, sort_keys=True, separators=(",", ":"))
            tags["data"] = text if len(text) <= 256 else text[:255] + "…"
        return tags


LINEAGE_TAGS = ("format", "run_dir", "checkpoint", "step", "config_sha256")


def _registered_model(ref: str):
    """The local workspace's registered model ``name`` or ``name:version``, or None when there is no model
    registry (toolkit.catalogue.model_registry) to ask."""
    try:
        from toolkit.catalogue.model_registry import get_model
    except ImportError as exc:
        if getattr(exc, "name", None) not in (None, "toolkit.catalogue.model_registry"):
            raise  # the registry exists but one of its own imports is broken: a bug, keep the traceback
        return None
    from toolkit.catalogue.workspace import Workspace

    try:
        return get_model(Workspace.open(None), ref)
    except (LookupError, ValueError, RuntimeError, OSError) as exc:  # the registry's own message names the ref
        raise AzureError(f"MODEL: {str(exc).removeprefix('model: ')}") from None


def resolve_model(model: str | Path) -> tuple[Path, Any]:
    """MODEL as given: an existing folder, else a registered model ``name[:version]`` of the local workspace.
    Returns the folder and the registered model (None for a folder given directly)."""
    given = str(model)
    path = Path(given).expanduser()
    if path.is_dir():
        return path.resolve(), None
    if path.exists():
        raise AzureError(not_allowed("MODEL", given, MODEL_WHAT, problem="is a file, not a folder"))
    from toolkit.names import split_ref

    registered = _registered_model(given) if split_ref(given) else None
    if registered is None:
        raise AzureError(refused("MODEL", f"folder {bounded_repr(given)} does not exist", MODEL_WHAT))
    folder = Path(registered.path)
    if not folder.is_dir():
        raise AzureError(
            not_allowed(
                "MODEL", given, MODEL_WHAT, problem=f"is registered at {str(folder)!r}, which is not a folder any more"
            )
        )
    return folder.resolve(), registered


def _manifest_version(value, where: str) -> str | None:
    if value in (None, 0, "0", ""):
        return None
    if isinstance(value, bool) or not str(value).isdigit():
        raise AzureError(
            refused(
                "MODEL",
                f"version {bounded_repr(value)} in {where} is not allowed",
                "a whole number of 1 or more (or none for an unregistered export)",
            )
        )
    return str(int(value))


def _default_name(path: Path, manifest: dict) -> str | None:
    """An export's name when neither the manifest nor the registry gives one: the run config's name, else the
    model's (the name `trainbook models register` would give it)."""
    import yaml

    try:
        config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        config = None
    name = config.get("name") if isinstance(config, dict) else None
    return name or manifest.get("model")


def _verified_manifest(path: Path, runtime: str | None) -> tuple[dict, str]:
    """The manifest of the folder the plan uploads as the model, once every file matches it, and the runtime that
    serves it (``runtime``, or the folder's default). The owner of both checks is toolkit.catalogue.model_format; the
    weights the runtime loads are named first, with the other runtime as the way out."""
    from toolkit.deploy.serving.options import check_runtime, served_tasks

    try:
        manifest = read_manifest(path)
        runtime = check_runtime(path, manifest, runtime)
        served_tasks(manifest)
        return verify_model_folder(path), runtime
    except ExportError as exc:
        raise AzureError(f"MODEL: {str(exc).removeprefix('model: ')}") from None


def read_model_folder(path: Path, runtime: str | None, registered=None) -> ModelFolder:
    """Check an exported model folder: its manifest, every file it lists (size and sha256), and the weights
    ``runtime`` (None: the folder's default) loads. Name and version: the local registration's if MODEL named one,
    else the manifest's, else the run config's name and no version (Azure ML numbers it)."""
    from toolkit.names import NAME_ALLOWED, is_name

    manifest, runtime = _verified_manifest(path, runtime)
    where = repr(str(path / MANIFEST))
    name = registered.name if registered else manifest.get("name") or _default_name(path, manifest)
    if not is_name(name):
        raise AzureError(refused("MODEL", f"name {bounded_repr(name)} of {where} is not allowed", NAME_ALLOWED))
    version = _manifest_version(registered.version if registered else manifest.get("version"), where)
    description = str(
        (registered.description if registered else "")
        or manifest.get("description")
        or f"Trainbook model {name} ({manifest.get('format', '?')})"
    )
    return ModelFolder(path, manifest, name, version, description, runtime)


# --- the plan --------------------------------------------------------------------------------------------------


def _check_scoring_script(upload: code_upload.CodeUpload) -> None:
    """score.py must be uploaded and parse (the SDK parses it too, but only when deploying)."""
    path = code_upload.require(
        upload, entities.SCORING_SCRIPT, "scoring_script", "the scoring script of the local endpoint (init() and run())"
    )
    try:
        ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        where = f"line {exc.lineno}: {exc.msg}" if isinstance(exc, SyntaxError) else str(exc)
        raise AzureError(
            not_allowed("scoring_script", path, "valid Python", problem=f"does not parse ({where})")
        ) from None


def _check_serving_conda_file(conda: Path) -> None:
    if INFERENCE_SERVER not in read_conda_file(conda, field="environment.yml"):
        raise AzureError(
            not_allowed(
                "environment.yml",
                conda,
                "a conda file with it (Azure ML runs score.py with that server)",
                problem=f"has no {INFERENCE_SERVER} in its pip list",
            )
        )


@dataclass
class DeploymentPlan:
    """A validated deployment plan: the options, what was checked, and the SDK entities built from them."""

    options: DeployOptions
    serving: ServingOptions
    sku: Sku
    model: ModelFolder
    image: str
    conda_file: Path
    code: code_upload.CodeUpload
    workspace: WorkspaceRef | None
    endpoint: Any  # azure.ai.ml.entities.ManagedOnlineEndpoint
    environment: Any  # azure.ai.ml.entities.Environment (inline in the deployment)
    deployment: Any  # azure.ai.ml.entities.ManagedOnlineDeployment

    def summary(self) -> str:
        """A short table of what was planned."""
        o, s = self.options, self.serving
        rows = [
            ("endpoint", f"{o.endpoint}: managed online endpoint, key authentication"),
            ("deployment", f"{o.deployment}: {o.instance_count} x {self.sku.describe()}"),
            ("model", f"{self.model.ref}, {self.model.format}, from {self.model.path}"),
            (
                "runtime",
                f"{s.runtime} ({WEIGHTS[s.runtime]}); batches of up to {s.max_batch} requests, waiting at "
                f"most {s.max_wait_ms} ms; 1 worker x {s.threads} threads",
            ),
            (
                "image",
                f"{self.image} + {self.conda_file.name} (environment {self.environment.name}:"
                f"{self.environment.version})",
            ),
            ("code upload", self.code.describe()),
            ("workspace", self.workspace.describe() if self.workspace else "not given (placeholders in deploy.md)"),
        ]
        return "\n".join(f"{name:<12} {value}" for name, value in rows)


def build_deployment_plan(
    model: str | Path,
    *,
    endpoint: str,
    sku: str,
    instance_count: int = 1,
    deployment: str = "blue",
    runtime: str | None = None,
    max_batch: int = 16,
    max_wait_ms: int = 5,
    image: str | None = None,
    workspace: WorkspaceRef | None = None,
    project_root: str | Path | None = None,
) -> DeploymentPlan:
    """Validate everything (options, size, model folder, code upload and score.py, environment.yml) and build
    the endpoint, model, environment and deployment entities. ``runtime`` None: the model folder's default (torch
    for a transformers model, onnx for the built-ins)."""
    from toolkit.paths import PROJECT_ROOT

    options = DeployOptions(
        endpoint=str(endpoint), deployment=str(deployment), instance_count=instance_count, image=image
    )
    for wrong, message in DEPLOY_RULES:
        if wrong(options):
            raise AzureError(message(options))
    try:  # the serving knobs have one owner, shared with the local endpoint. Azure ML's server runs 16 threads
        # and answers the client itself after REQUEST_TIMEOUT_MS: score.py gives up on a request at the same time
        serving = ServingOptions(
            **({"runtime": str(runtime)} if runtime is not None else {}),
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            threads=entities.SERVER_THREADS,
            request_timeout=entities.REQUEST_TIMEOUT_MS / 1000,
        )
    except ServingOptionsError as exc:
        raise AzureError(str(exc)) from None
    the_sku = get_online_sku(sku)
    model_dir, registered = resolve_model(model)
    folder = read_model_folder(model_dir, runtime, registered)
    serving = dataclasses.replace(serving, runtime=folder.runtime)
    root = Path(project_root or PROJECT_ROOT).resolve()
    upload = code_upload.scan(root)
    code_upload.check(upload)
    _check_scoring_script(upload)
    conda = root / CONDA_COPY
    _check_serving_conda_file(conda)

    the_image = options.image or entities.serving_image(the_sku)
    base = "Azure Container for PyTorch" if the_image == entities.DEFAULT_IMAGE else "Azure ML inference image"
    environment = entities.environment(
        the_image,
        conda,
        name=entities.SERVING_ENVIRONMENT_NAME,
        description=f"Trainbook serving: {base} + the project's environment.yml",
    )
    model_entity = entities.model(
        folder.path, name=folder.name, version=folder.version, tags=folder.tags(), description=folder.description
    )
    tags = {"model": folder.ref, "runtime": serving.runtime}
    return DeploymentPlan(
        options=options,
        serving=serving,
        sku=the_sku,
        model=folder,
        image=the_image,
        conda_file=conda,
        code=upload,
        workspace=workspace,
        endpoint=entities.online_endpoint(
            options.endpoint,
            tags={"created_by": "trainbook", **tags},
            description=f"Trainbook: {folder.name} scored by {entities.SCORING_SCRIPT}",
        ),
        environment=environment,
        deployment=entities.online_deployment(
            options.deployment,
            endpoint_name=options.endpoint,
            model_entity=model_entity,
            code=root,
            environment_entity=environment,
            sku=the_sku,
            instance_count=options.instance_count,
            variables=serving.environment(),
            tags=tags,
        ),
    )


# --- writing ---------------------------------------------------------------------------------------------------


def _probe_text(probe: dict) -> str:
    return (
        f"from {probe['initial_delay']} s, every {probe['period']} s, timeout {probe['timeout']} s, "
        f"{probe['failure_threshold']} failures in a row"
    )


def _deploy_md(plan: DeploymentPlan, out: Path) -> str:
    o, flags = plan.options, az_flags(plan.workspace)
    variables = ", ".join(f"{k}={v}" for k, v in plan.deployment.environment_variables.items())
    return f"""# Azure ML deployment plan: {o.endpoint} / {o.deployment}

```
{plan.summary()}
```

## Deploy with the Azure CLI (`az extension add -n ml`)

Run from this folder: deployment.yaml names environment.yml relatively.

```
cd {out}
{az_account_line(plan.workspace)}
az ml online-endpoint create -f endpoint.yaml {flags}
az ml online-deployment create -f deployment.yaml --all-traffic {flags}
az ml online-endpoint show -n {o.endpoint} --query scoring_uri -o tsv {flags}
az ml online-endpoint get-credentials -n {o.endpoint} {flags}   # the keys: keep them out of logs and notebooks
```

If the endpoint exists already, update it instead: `az ml online-endpoint update -f endpoint.yaml {flags}`.
When a deployment does not become ready: `az ml online-deployment get-logs -n {o.deployment} -e {o.endpoint} {flags}`.

## Or with Trainbook (the same steps, then 100% of the traffic to {o.deployment})

```
{trainbook_command("deploy", out, plan.workspace)}
```

It prints the scoring URI, never a key.

## What runs

- Azure ML's inference server runs `{entities.SCORING_SCRIPT}` from the uploaded project folder, as the local
  endpoint does: `init()` loads the model, `run()` answers each request. The code upload is {plan.code.describe()}.
- The model folder is uploaded as model {plan.model.ref}; in the container it is under `$AZUREML_MODEL_DIR`,
  in a sub-folder named `{plan.model.path.name}`.
- Environment variables: {variables}. One worker process with {entities.SERVER_THREADS} threads takes concurrent
  requests, so score.py can batch them; Azure ML admits {entities.SERVER_THREADS} concurrent requests per instance
  (more get HTTP 429) and times a request out after {entities.REQUEST_TIMEOUT_MS} ms.
- Probes: readiness {_probe_text(entities.READINESS_PROBE)}; liveness {_probe_text(entities.LIVENESS_PROBE)}.
- Re-creating the environment is a no-op: its version ({plan.environment.version}) is a hash of the image and
  environment.yml.
"""


def _files(plan: DeploymentPlan, out: Path) -> dict[str, str]:
    """File name -> text, everything a deployment plan folder holds except the copied conda file."""
    flags = az_flags(plan.workspace)
    with _quiet():
        deployment = plain(plan.deployment._to_dict())
    deployment["environment"] = environment_dict(plan.environment)
    return {
        "endpoint.yaml": yaml_text(
            SCHEMAS["endpoint.yaml"],
            plain(plan.endpoint._to_dict()),
            verb="deploy-plan",
            create=f"az ml online-endpoint create -f endpoint.yaml {flags}",
        ),
        "deployment.yaml": yaml_text(
            SCHEMAS["deployment.yaml"],
            deployment,
            verb="deploy-plan",
            create=f"az ml online-deployment create -f deployment.yaml --all-traffic {flags}",
        ),
        "deploy.md": _deploy_md(plan, out),
    }


@contextlib.contextmanager
def _quiet():
    """Without azure-ai-ml's notice that one of its own internal schemas (DeploymentTemplateReference, met when a
    deployment is dumped or loaded) is experimental: it says nothing about the plan, and stderr is for what does."""
    notices = logging.getLogger("azure.ai.ml._utils._experimental")
    level = notices.level
    notices.setLevel(logging.ERROR)
    try:
        yield
    finally:
        notices.setLevel(level)


def _quietly(load: Callable) -> Callable:
    def run(path):
        with _quiet():
            return load(path)

    return run


def sdk_loaders() -> dict:
    """Deployment plan file name -> the azure-ai-ml loader that reads it."""
    from azure.ai.ml import load_online_deployment, load_online_endpoint

    return {"endpoint.yaml": _quietly(load_online_endpoint), "deployment.yaml": _quietly(load_online_deployment)}


# Every file a deployment plan folder holds: what an earlier one is.
DEPLOYMENT_PLAN_FILES = frozenset({"endpoint.yaml", "deployment.yaml", "deploy.md", CONDA_COPY})


def write_deployment_plan(plan: DeploymentPlan, out_dir: str | Path) -> Path:
    """Write the deployment plan folder; returns its path. An earlier deployment plan there is replaced whole."""
    out = Path(out_dir).expanduser().absolute()
    return publish(
        out,
        files=_files(plan, out),
        copies={CONDA_COPY: plan.conda_file},
        loaders=sdk_loaders(),
        marker="deployment.yaml",
        kind="deployment plan",
        may_hold=DEPLOYMENT_PLAN_FILES,
    )
