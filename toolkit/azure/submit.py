"""Submit a plan folder to an Azure ML workspace: load its YAML with the SDK's loaders, check the login, create
compute, environment and data, submit the job, stream its log.

Order matters for fast, plain failures: the plan is read and checked offline first, then one token is fetched
(seconds when nothing is logged in), and only then does anything talk to the workspace.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from toolkit.azure.connection import WorkspaceRef, check_credentials, default_credential, ml_client
from toolkit.azure.errors import AzureError
from toolkit.azure.plan import sdk_loaders
from toolkit.errors import not_allowed, refused

REQUIRED = ("compute.yaml", "environment.yaml", "job.yaml")
OPTIONAL = ("data.yaml",)


@dataclass
class LoadedPlan:
    """The entities of a plan folder, as the SDK loaded them."""

    folder: Path
    compute: Any
    environment: Any
    data: Any  # None without data.yaml
    job: Any


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", "") or exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def load_folder(
    plan_dir: str | Path,
    loaders: dict[str, Callable],
    required: tuple[str, ...],
    *,
    kind: str = "plan",
    verb: str = "plan",
) -> tuple[Path, dict[str, Any]]:
    """Read a plan folder back with azure-ai-ml's ``loaders`` (offline): its absolute path and file name ->
    entity (None for an optional file that is absent). A missing or hand-broken file is an AzureError naming it;
    ``kind`` and ``verb`` name the folder and the command that writes it."""
    folder = Path(plan_dir).expanduser().absolute()
    missing = [name for name in required if not (folder / name).is_file()]
    if not folder.is_dir() or missing:
        raise AzureError(
            not_allowed(
                "plan_dir",
                folder,
                f"a folder written by `trainbook azure {verb}`",
                problem=f"is not a {kind} folder (missing {', '.join(missing or required)})",
            )
        )
    loaded = {}
    for name, load in loaders.items():
        if not (folder / name).is_file():
            loaded[name] = None
            continue
        try:
            loaded[name] = load(folder / name)
        except Exception as exc:  # noqa: BLE001 - the SDK raises several types for a bad file; all mean "fix it"
            raise AzureError(
                refused(
                    name,
                    f"the Azure ML SDK cannot load it ({_first_line(exc)})",
                    f"a file written by `trainbook azure {verb}` ({verb} again)",
                )
            ) from None
    return folder, loaded


def check_local_paths(
    folder: Path, checks: list[tuple[str, Any]], *, action: str = "submit", verb: str = "plan"
) -> None:
    """The uploads (code, data snapshot, model folder) are local paths from planning time: they must still be
    there. ``checks``: (what to call it, the path as the YAML holds it)."""
    for field, path in checks:
        if isinstance(path, str) and "://" not in path and not path.startswith("azureml:"):
            if not (folder / path).exists():  # absolute paths ignore the folder
                raise AzureError(
                    not_allowed(
                        field,
                        path,
                        f"{action} from the machine that planned (or {verb} again)",
                        problem="does not exist on this machine",
                    )
                )


def load_plan(plan_dir: str | Path) -> LoadedPlan:
    """Read a plan folder back with azure-ai-ml's loaders (offline); a missing or hand-broken file is an
    AzureError naming it."""
    folder, loaded = load_folder(plan_dir, sdk_loaders(), REQUIRED)
    plan = LoadedPlan(
        folder, loaded["compute.yaml"], loaded["environment.yaml"], loaded["data.yaml"], loaded["job.yaml"]
    )
    checks = [("job.yaml code", plan.job.code)]
    # the loader drops "azureml:" from the data input: 'name:version' names the asset data.yaml creates, not a file
    asset = f"{plan.data.name}:{plan.data.version}" if plan.data is not None else None
    if plan.data is not None:
        checks.append(("data.yaml path", plan.data.path))
    for name, given in plan.job.inputs.items():  # the config, the user's model code, model weights: local folders
        path = getattr(given, "path", None) or getattr(getattr(given, "_data", None), "path", None)
        if path != asset:
            checks.append((f"job.yaml inputs.{name}", path))
    check_local_paths(folder, checks)
    recheck_code(folder, plan.job.code)
    return plan


def run_location(job) -> str | None:
    """The datastore folder of a loaded plan's run (what submitting again resumes); None when the run directory is
    node-local (--run-storage local)."""
    from toolkit.azure.entities import RUNS_OUTPUT

    output = (job.outputs or {}).get(RUNS_OUTPUT)
    path = getattr(getattr(output, "_data", output), "path", None)  # the loader wraps an output in a binding
    name = (job.tags or {}).get("run_name")
    return f"{path.rstrip('/')}/{name}/" if isinstance(path, str) and name else None


def recheck_code(folder: Path, code) -> None:
    """The code folder is uploaded as it is now, not as it was planned: check it again (limits, and no secret
    such as a workspace or an endpoint key added since)."""
    from toolkit.azure import code_upload

    if isinstance(code, str) and "://" not in code and not code.startswith("azureml:"):
        code_upload.check(code_upload.scan(folder / code))


# --- talking to the workspace ------------------------------------------------------------------------------------


def _explain_service_error(exc: BaseException, step: str, ref: WorkspaceRef) -> str:
    """An azure.core error as one line that says which piece is missing."""
    from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ServiceRequestError

    status = getattr(exc, "status_code", None)
    if isinstance(exc, ServiceRequestError):
        return f"workspace: management.azure.com is unreachable (network or proxy) for {ref.describe()}"
    if isinstance(exc, ClientAuthenticationError) or status == 401:
        return f"credentials: refused by Azure for {ref.describe()}; run `az login` again"
    if status == 403:
        return refused(
            "workspace",
            f"no permission for {step} in {ref.describe()}",
            "an identity with the AzureML Data Scientist role (or Contributor) on the workspace",
        )
    if status == 404 and step == "workspace":
        return f"workspace: {ref.describe()} was not found; check config.json (download it again from the studio)"
    if isinstance(exc, HttpResponseError):
        return f"{step}: Azure ML refused it ({_first_line(exc)})"
    return f"{step}: {_first_line(exc)}"


def call(step: str, ref: WorkspaceRef, action: Callable[[], Any]) -> Any:
    from azure.core.exceptions import AzureError as AzureCoreError

    try:
        return action()
    except AzureCoreError as exc:
        raise AzureError(_explain_service_error(exc, step, ref)) from None


def log_to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def connect(workspace: WorkspaceRef, credential=None, log: Callable[[str], None] = log_to_stderr):
    """An MLClient on ``workspace`` once a token was fetched (seconds when nothing is logged in) and the
    workspace answered: nothing is created before both are known to work."""
    credential = credential or default_credential()
    check_credentials(credential)
    client = ml_client(workspace, credential)
    call("workspace", workspace, lambda: client.workspaces.get(workspace.workspace_name))
    log(f"workspace: {workspace.describe()}")
    return client


def submit(
    plan_dir: str | Path,
    workspace: WorkspaceRef,
    *,
    stream: bool = True,
    credential=None,
    log: Callable[[str], None] | None = None,
):
    """Create the plan's compute, environment and data in ``workspace``, submit its job, and stream the log.
    Returns the submitted job (its ``name`` and ``studio_url``)."""
    log = log or log_to_stderr
    plan = load_plan(plan_dir)
    client = connect(workspace, credential, log)
    steps = [
        ("compute", lambda: client.compute.begin_create_or_update(plan.compute).result(), plan.compute),
        ("environment", lambda: client.environments.create_or_update(plan.environment), plan.environment),
        ("data", lambda: client.data.create_or_update(plan.data), plan.data),
    ]
    for step, action, entity in steps:
        if entity is None:
            continue
        created = call(step, workspace, action)
        version = getattr(created, "version", None)
        log(f"{step}: {created.name}" + (f":{version}" if version else ""))
    job = call("job", workspace, lambda: client.jobs.create_or_update(plan.job))
    log(f"job: {job.name} submitted; studio: {job.studio_url}")
    if location := run_location(plan.job):
        log(f"run: {location} (submitting this plan again resumes it)")
    if stream:
        call("job", workspace, lambda: client.jobs.stream(job.name))
    return job
