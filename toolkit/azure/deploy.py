"""Deploy a deployment plan folder to an Azure ML workspace: load its YAML with the SDK's loaders, check the login,
create or update the endpoint, then the deployment (uploading the model folder and the project code), then send
100% of the traffic to it.

Same order as submit.py, for the same fast, plain failures: the plan offline first, then one token, then the
workspace. No key is ever fetched or printed: ``az ml online-endpoint get-credentials`` shows them on request.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from toolkit.azure.connection import WorkspaceRef
from toolkit.azure.deploy_plan import sdk_loaders
from toolkit.azure.errors import AzureError
from toolkit.azure.plan_files import az_flags
from toolkit.azure.submit import call, check_local_paths, connect, load_folder, log_to_stderr, recheck_code
from toolkit.errors import not_allowed

REQUIRED = ("endpoint.yaml", "deployment.yaml")


@dataclass
class LoadedDeploymentPlan:
    """The entities of a deployment plan folder, as the SDK loaded them."""

    folder: Path
    endpoint: Any  # ManagedOnlineEndpoint
    deployment: Any  # ManagedOnlineDeployment


def load_deployment_plan(plan_dir: str | Path) -> LoadedDeploymentPlan:
    """Read a deployment plan folder back with azure-ai-ml's loaders (offline); the model folder and the code it
    uploads must still be on this machine."""
    folder, loaded = load_folder(plan_dir, sdk_loaders(), REQUIRED, kind="deployment plan", verb="deploy-plan")
    plan = LoadedDeploymentPlan(folder, loaded["endpoint.yaml"], loaded["deployment.yaml"])
    deployment = plan.deployment
    if deployment.endpoint_name != plan.endpoint.name:
        raise AzureError(
            not_allowed(
                "deployment.yaml endpoint_name",
                deployment.endpoint_name,
                f"{plan.endpoint.name!r}, the endpoint of endpoint.yaml",
            )
        )
    model_path = getattr(deployment.model, "path", deployment.model)
    check_local_paths(
        folder,
        [
            ("deployment.yaml model.path", model_path),
            ("deployment.yaml code_configuration.code", deployment.code_configuration.code),
        ],
        action="deploy",
        verb="deploy-plan",
    )
    recheck_code(folder, deployment.code_configuration.code)
    return plan


def credentials_hint(endpoint: str, ref: WorkspaceRef) -> str:
    """How to get the endpoint's keys, without getting them."""
    return f"az ml online-endpoint get-credentials -n {endpoint} {az_flags(ref)}"


def deploy(plan_dir: str | Path, workspace: WorkspaceRef, *, credential=None, log: Callable[[str], None] | None = None):
    """Create or update the plan's endpoint and deployment in ``workspace`` and route all traffic to the
    deployment. Returns the endpoint as Azure ML reports it (its ``scoring_uri``; never its keys)."""
    log = log or log_to_stderr
    plan = load_deployment_plan(plan_dir)
    client = connect(workspace, credential, log)
    endpoint, deployment = plan.endpoint, plan.deployment
    created = call("endpoint", workspace, lambda: client.online_endpoints.begin_create_or_update(endpoint).result())
    log(f"endpoint: {endpoint.name} ({getattr(created, 'provisioning_state', None) or 'created'})")
    log(
        f"deployment: {deployment.name} on {deployment.instance_count} x {deployment.instance_type}: uploading the "
        "model and the code, building the image and starting the instances (often 10 minutes or more)"
    )
    try:
        call("deployment", workspace, lambda: client.online_deployments.begin_create_or_update(deployment).result())
    except AzureError as exc:
        raise AzureError(
            f"{exc}; logs: az ml online-deployment get-logs -n {deployment.name} -e {endpoint.name} "
            f"{az_flags(workspace)}"
        ) from None
    log(f"deployment: {deployment.name} ready")
    endpoint.traffic = {deployment.name: 100}
    call("traffic", workspace, lambda: client.online_endpoints.begin_create_or_update(endpoint).result())
    log(f"traffic: 100% to {deployment.name}")
    return call("endpoint", workspace, lambda: client.online_endpoints.get(endpoint.name))
