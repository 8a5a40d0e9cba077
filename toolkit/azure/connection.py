"""Which Azure ML workspace, and can we reach it: ``config.json`` or explicit names, and a quick credential check.

The subscription id is treated as a secret-ish identifier: it is never printed or written in full, only masked
(``1234…cdef``). Tokens never leave azure.identity.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.azure.errors import AzureError
from toolkit.errors import not_allowed, refused

KEYS = ("subscription_id", "resource_group", "workspace_name")
SEARCH = (Path("config.json"), Path(".azureml") / "config.json")  # relative to the current folder, in this order
GUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
GET_ONE = (
    "download config.json from the Azure ML studio workspace page: workspace menu at the top right, "
    "Download config file"
)
ARM_SCOPE = "https://management.azure.com/.default"
CREDENTIAL_TIMEOUT_S = 30.0  # a blackholed network would otherwise hold the token request for minutes
# Set by Azure hosts that offer a managed identity (App Service, Functions, Azure ML compute), or by hand
# (TRAINBOOK_AZURE_MANAGED_IDENTITY=1) on an Azure VM with one; elsewhere the managed-identity probe of the
# instance metadata service only costs time, so it is left out of the chain.
MANAGED_IDENTITY_VARS = ("IDENTITY_ENDPOINT", "MSI_ENDPOINT", "TRAINBOOK_AZURE_MANAGED_IDENTITY")
NO_CREDENTIALS = (
    "credentials: none found; run `az login` (Azure CLI) or set AZURE_CLIENT_ID, AZURE_TENANT_ID and "
    "AZURE_CLIENT_SECRET (a service principal)"
)


def mask(secret: str) -> str:
    """``'12345678-…-00000000cdef'`` -> ``'1234…cdef'``: enough to tell two apart, not enough to use."""
    secret = str(secret)
    return f"{secret[:4]}…{secret[-4:]}" if len(secret) > 8 else "…"


@dataclass(frozen=True)
class WorkspaceRef:
    """An Azure ML workspace by subscription, resource group and name; ``source`` says where that came from."""

    subscription_id: str = field(repr=False)
    resource_group: str
    workspace_name: str
    source: str = "arguments"

    def masked(self) -> str:
        """The subscription id masked, e.g. ``1234…cdef``."""
        return mask(self.subscription_id)

    def describe(self) -> str:
        """One line for people: workspace, resource group, masked subscription."""
        return f"workspace {self.workspace_name} in resource group {self.resource_group} (subscription {self.masked()})"

    def __repr__(self) -> str:
        return (
            f"WorkspaceRef(subscription_id={self.masked()!r}, resource_group={self.resource_group!r}, "
            f"workspace_name={self.workspace_name!r}, source={self.source!r})"
        )


def _check_values(values: dict, where: str) -> WorkspaceRef:
    for key in KEYS:
        value = values.get(key)
        if value is None:
            raise AzureError(
                refused(
                    key,
                    f"missing in {where}",
                    f"a config.json with subscription_id, resource_group and workspace_name; {GET_ONE}",
                )
            )
        if not isinstance(value, str) or not value.strip():
            shown = mask(value) if key == "subscription_id" and value else value
            raise AzureError(not_allowed(key, shown, "a non-empty string", problem=f"in {where} is not allowed"))
    subscription = values["subscription_id"].strip()
    if not GUID_RE.fullmatch(subscription):
        raise AzureError(
            not_allowed(
                "subscription_id",
                mask(subscription),
                "a GUID like 00000000-0000-0000-0000-000000000000",
                problem=f"in {where} is not allowed",
            )
        )
    return WorkspaceRef(subscription, values["resource_group"].strip(), values["workspace_name"].strip(), where)


CLI_FIELD = "--workspace-config"  # how the command line names the config; a notebook passes its parameter's name


def find_config(path: str | Path | None = None, cwd: str | Path | None = None, config_field: str = CLI_FIELD) -> Path:
    """The config.json to read: ``path`` (a file, or a folder holding config.json), else the first of
    ./config.json and ./.azureml/config.json. Messages name ``config_field``, the option or parameter ``path`` came
    in."""
    if path is not None:
        candidate = Path(path).expanduser()
        candidate = candidate / "config.json" if candidate.is_dir() else candidate
        if not candidate.is_file():
            raise AzureError(
                not_allowed(config_field, candidate, f"an Azure ML config.json; {GET_ONE}", problem="does not exist")
            )
        return candidate
    base = Path(cwd) if cwd is not None else Path.cwd()
    tried = [base / rel for rel in SEARCH]
    for candidate in tried:
        if candidate.is_file():
            return candidate
    other = (
        f"pass {CLI_FIELD} PATH or --subscription, --resource-group and --workspace-name"
        if config_field == CLI_FIELD
        else f"set {config_field} to its path"
    )
    raise AzureError(f"{config_field}: no config.json at {' or '.join(map(str, tried))}; {GET_ONE}, or {other}")


def read_config(path: str | Path, config_field: str = CLI_FIELD) -> WorkspaceRef:
    """Read and validate one Azure ML ``config.json`` (given as ``config_field``)."""
    path = Path(path)
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise AzureError(
            not_allowed(
                config_field,
                path,
                "the config.json from the Azure ML studio workspace page",
                problem=f"is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            )
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AzureError(
            not_allowed(config_field, path, "a readable config.json", problem=f"cannot be read ({exc})")
        ) from None
    if not isinstance(values, dict):
        raise AzureError(
            not_allowed(
                config_field,
                path,
                '{"subscription_id": ..., "resource_group": ..., "workspace_name": ...}',
                problem=f"holds a {type(values).__name__}, not an object",
            )
        )
    return _check_values(values, str(path))


def workspace_ref(
    config: str | Path | None = None,
    *,
    subscription_id: str | None = None,
    resource_group: str | None = None,
    workspace_name: str | None = None,
    cwd: str | Path | None = None,
    config_field: str = CLI_FIELD,
) -> WorkspaceRef:
    """The workspace from explicit names (all three) or from a config.json (``config``, else the default search)."""
    explicit = {"subscription_id": subscription_id, "resource_group": resource_group, "workspace_name": workspace_name}
    if any(v is not None for v in explicit.values()):
        if config is not None:
            raise AzureError(
                refused(
                    "--workspace-config",
                    "given together with --subscription/--resource-group/--workspace-name",
                    "one or the other",
                )
            )
        flags = {
            "subscription_id": "--subscription",
            "resource_group": "--resource-group",
            "workspace_name": "--workspace-name",
        }
        missing = [flags[k] for k, v in explicit.items() if v is None]
        if missing:
            raise AzureError(
                refused(
                    missing[0],
                    "missing",
                    "all three of --subscription, --resource-group and --workspace-name, or --workspace-config PATH",
                )
            )
        return _check_values(explicit, "arguments")
    return read_config(find_config(config, cwd, config_field), config_field)


# --- credentials -----------------------------------------------------------------------------------------------


def on_azure() -> bool:
    """True where a managed identity is on offer (see MANAGED_IDENTITY_VARS)."""
    return any(os.environ.get(name) for name in MANAGED_IDENTITY_VARS)


def default_credential():
    """``DefaultAzureCredential`` without the interactive browser (a CLI must never hang on a login page) and
    without managed identity unless this host offers one."""
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(
        exclude_interactive_browser_credential=True, exclude_managed_identity_credential=not on_azure()
    )


# Words with which azure.identity says a credential is simply not set up here (as opposed to set up but failing).
UNAVAILABLE = (
    "unavailable",
    "not found",
    "not installed",
    "could not be found",
    "requires",
    "no accounts",
    "not fully configured",
    "missing required",
)
# How a set-up credential fails, most specific first: (words in the SDK's message, what we tell the user).
CREDENTIAL_FAILURES = [
    (
        ("failed to resolve", "name or service not known", "connection", "timed out", "network"),
        "credentials: {name} is set up, but login.microsoftonline.com could not be reached (network or proxy); "
        "check the connection, then try again",
    ),
    (
        ("invalid_client", "aadsts", "authentication failed"),
        "credentials: {name} is set up, but Microsoft Entra ID refused it; run `az login` again or check "
        "AZURE_CLIENT_ID, AZURE_TENANT_ID and AZURE_CLIENT_SECRET",
    ),
]


def _explain(message: str) -> str:
    """One line from DefaultAzureCredential's multi-line report ("Attempted credentials: ..." one per line)."""
    attempts = [line.strip() for line in message.splitlines() if re.match(r"\s+\w+Credential: ", line)]
    if not attempts:  # a single credential's error, or a transport error: one line, no chain
        attempts = [f"DefaultAzureCredential: {(message.strip().splitlines() or [''])[0]}"]
    tried = [a for a in attempts if not any(word in a.lower() for word in UNAVAILABLE)]
    if not tried:
        return NO_CREDENTIALS
    name, _, detail = tried[0].partition(": ")
    for words, explanation in CREDENTIAL_FAILURES:
        if any(word in detail.lower() for word in words):
            return explanation.format(name=name)
    return f"credentials: {name} failed ({detail[:200]}); run `az login` or check AZURE_CLIENT_ID/AZURE_TENANT_ID"


def check_credentials(credential=None, timeout: float = CREDENTIAL_TIMEOUT_S) -> None:
    """Get one ARM token before any other network call, so a missing login fails in seconds with a plain message
    instead of deep inside the first upload."""
    from azure.core.exceptions import ClientAuthenticationError

    credential = credential or default_credential()
    outcome: dict = {}

    def attempt() -> None:
        try:
            credential.get_token(ARM_SCOPE)
            outcome["ok"] = True
        except ClientAuthenticationError as exc:  # CredentialUnavailableError is one of these
            outcome["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - transport errors vary by stack; all mean "cannot get a token"
            outcome["error"] = f"network: {exc}"

    identity_log = logging.getLogger("azure.identity")
    level = identity_log.level
    identity_log.setLevel(logging.CRITICAL)  # its warnings repeat the whole chain on stderr; we say it once
    try:
        worker = threading.Thread(target=attempt, daemon=True)
        worker.start()
        worker.join(timeout)
    finally:
        identity_log.setLevel(level)
    if "ok" in outcome:
        return
    if "error" not in outcome:
        raise AzureError(
            refused(
                "credentials",
                f"no token within {timeout:.0f} s",
                "a network that reaches login.microsoftonline.com (check proxy settings)",
            )
        )
    raise AzureError(_explain(outcome["error"]))


def ml_client(ref: WorkspaceRef, credential=None):
    """An ``MLClient`` on the workspace (builds offline; the first call authenticates)."""
    from azure.ai.ml import MLClient

    return MLClient(
        credential or default_credential(),
        subscription_id=ref.subscription_id,
        resource_group_name=ref.resource_group,
        workspace_name=ref.workspace_name,
    )


@dataclass(frozen=True)
class ConnectionStatus:
    """Where Azure ML stands from here: the workspace (if a config names one), and whether a token was issued."""

    workspace: WorkspaceRef | None
    connected: bool
    reason: str  # why not, naming the missing piece; or what works

    def summary(self) -> str:
        where = f"{self.workspace.describe()}; " if self.workspace else ""
        return f"Azure ML: {'connected' if self.connected else 'not connected, working offline'}. {where}{self.reason}"


def connection_status(
    config: str | Path | None = None, credential=None, config_field: str = CLI_FIELD
) -> ConnectionStatus:
    """Find the workspace config and get one token; never raises for a missing piece (that is the answer).
    ``config_field``: how the caller's user names the config (a notebook's parameter), for the messages."""
    try:
        ref = workspace_ref(config, config_field=config_field)
    except AzureError as exc:
        return ConnectionStatus(None, False, str(exc))
    try:
        check_credentials(credential)
    except AzureError as exc:
        return ConnectionStatus(ref, False, str(exc))
    return ConnectionStatus(
        ref, True, "credentials: a token was issued; `python -m toolkit azure submit` can create and run a plan"
    )
