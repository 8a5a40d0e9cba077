"""What every plan folder shares (a training plan, a deployment plan): the checks of the options both take, the
YAML files with their create command on top, the `az` lines that name the workspace, and publishing the folder
atomically after every YAML loaded back through the SDK's own loader.

A folder is assembled in a staging folder next to its destination, fsynced and swapped into place in one step
(toolkit.fsio, as exports are), so a failed or killed plan leaves nothing behind and a replaced plan is never
missing, nor half old, half new. ``--out`` is never a link, and only an earlier plan of the same kind is replaced.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from collections.abc import Callable

import yaml

from toolkit import fsio
from toolkit.azure.connection import WorkspaceRef
from toolkit.azure.errors import AzureError

SCHEMA_BASE = "https://azuremlschemas.azureedge.net/latest/"
IMAGE_RE = re.compile(r"[a-z0-9.-]+(:\d+)?(/[a-z0-9._-]+)+(:[A-Za-z0-9._-]+|@sha256:[0-9a-f]{64})?")
CONDA_COPY = "environment.yml"  # the conda file travels with the plan; the YAML names it relatively


# --- checks both plans make ----------------------------------------------------------------------------------------


def image_ok(image: str) -> bool:
    """A container image reference: registry/path[:tag|@sha256:digest]."""
    return bool(IMAGE_RE.fullmatch(image))


def read_conda_file(path: Path, field: str = "--conda-file") -> list[str]:
    """environment.yml must be a conda file with a pip section: Azure ML builds the image from it. Returns its
    pip packages (normalised names)."""
    from toolkit.resources.drift import EnvironmentFileError, declared_packages

    try:
        return declared_packages(path, field=field)
    except EnvironmentFileError as exc:
        raise AzureError(str(exc)) from None


# --- the files -----------------------------------------------------------------------------------------------------


def plain(value) -> Any:
    """The SDK's dicts are OrderedDicts (which yaml.safe_dump refuses); drop empty top-level sections."""
    return {k: v for k, v in json.loads(json.dumps(value)).items() if v not in (None, {}, [])}


def environment_dict(environment) -> dict:
    """An Environment as plan YAML: the SDK inlines the conda file; a path to the copy beside the YAML keeps it
    one diffable file."""
    content = plain(environment._to_dict())
    content["conda_file"] = CONDA_COPY
    return content


def yaml_text(schema: str, content: dict, *, verb: str, create: str) -> str:
    """One plan YAML: who wrote it and how to create it, the ``$schema`` (a file name under SCHEMA_BASE), then
    the content in the SDK's own field order."""
    header = f"# Written by `trainbook azure {verb}`. Create it with: {create}\n"
    # never folded: a job's command reads as the one line it runs, not split across lines mid-argument
    return header + yaml.safe_dump({"$schema": SCHEMA_BASE + schema, **content}, sort_keys=False, width=1 << 16)


def az_flags(ref: WorkspaceRef | None) -> str:
    """``-g RG -w WS`` for the az ml commands, placeholders without a workspace."""
    return f"-g {ref.resource_group} -w {ref.workspace_name}" if ref else "-g <resource-group> -w <workspace-name>"


def _from_config_file(ref: WorkspaceRef | None) -> bool:
    return ref is not None and ref.source != "arguments"


def az_account_line(ref: WorkspaceRef | None) -> str:
    """The ``az account set`` line: the subscription is never written, only its mask as a reminder."""
    line = "az account set --subscription <subscription id>"
    return f"{line}   # {ref.masked()}, from {Path(ref.source).name}" if _from_config_file(ref) else line


def trainbook_command(verb: str, out: Path, ref: WorkspaceRef | None) -> str:
    """``python -m toolkit azure VERB OUT --workspace-config ...`` with the config.json the plan was made with."""
    config = ref.source if _from_config_file(ref) else "config.json"
    return f"python -m toolkit azure {verb} {out} --workspace-config {config}"


# --- publishing ----------------------------------------------------------------------------------------------------


def verify(folder: Path, loaders: dict[str, Callable]) -> None:
    """Load every YAML back with the SDK's own loaders: a plan that does not load is never published."""
    for name, load in loaders.items():
        if (folder / name).exists():
            load(folder / name)


def publish(
    out_dir: str | Path,
    *,
    files: dict[str, str],
    copies: dict[str, Path],
    loaders: dict[str, Callable],
    marker: str,
    kind: str,
    may_hold: frozenset[str],
    subfolders: frozenset[str] = frozenset(),
) -> Path:
    """Write ``files`` (name -> text) and ``copies`` (name -> source file; a name may lie inside one of
    ``subfolders``, e.g. 'model-code/pkg/mod.py') as the folder ``out_dir``, verified with ``loaders``; an earlier
    ``kind`` there (a folder holding ``marker`` and only names of ``may_hold`` and ``subfolders``) is replaced as a
    whole. Returns the folder's path."""
    out = Path(out_dir).expanduser().absolute()
    # new, empty or an earlier ``kind``; never a link, never a folder holding anything a plan does not write
    rule = {
        "marker": marker,
        "kind": kind,
        "error": AzureError,
        "may_hold": lambda _: may_hold,
        "subfolders": subfolders,
    }
    fsio.check_replaceable(out, **rule)  # before any work; checked again just before the swap
    with fsio.staging_folder(out) as tmp:
        for name, source in copies.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, tmp / name)
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        verify(tmp, loaders)
        fsio.publish_folder(tmp, out, **rule)
    return out
