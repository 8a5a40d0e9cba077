"""What ``code:`` would upload: the project folder filtered the way azure-ai-ml filters it, checked against the
snapshot limit, against the files the job cannot run without, and against secrets (a code snapshot is readable by
everyone with access to the Azure ML workspace, and kept with every job).

The SDK's own helpers decide what is ignored (``get_ignore_file``: ``.amlignore`` if present, else ``.gitignore``,
only in the root folder; ``traverse_directory``: which files of a folder survive it), so this check and the real
upload agree.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from toolkit.azure.errors import AzureError
from toolkit.errors import not_allowed, refused

# Azure ML's documented limit for a job's code snapshot ("300 MB and/or 2000 files").
SNAPSHOT_LIMIT_BYTES = 300 * 10**6
SNAPSHOT_LIMIT_FILES = 2000
MB = 10**6  # the SDK reports upload sizes in 10**6 bytes; so do we
NEEDED = ("toolkit/**/*.py", "toolkit/configs/*.yaml", "pyproject.toml")  # what `python -m toolkit.runs.worker` imports and reads
# Secret-looking files, by name: (pattern over the basename, what it is). Endpoint keys are files named `key`
# (toolkit.deploy.serving.endpoint); the rest are the usual private-key and environment files.
SECRET_NAMES = ((re.compile(r"key"), "an endpoint key"), (re.compile(r".*\.(pem|key)"), "a private key or certificate"),
                (re.compile(r"id_(rsa|dsa|ecdsa|ed25519)(\.pub)?"), "an SSH key"),
                (re.compile(r"\.env(\..+)?"), "an environment file (often holds credentials)"))
# Folders whose every file is a secret or private: Trainbook workspaces (keys, the catalogue, data) and the Azure ML
# config folder that MLClient.from_config reads.
SECRET_FOLDERS = {".trainbook": "a Trainbook workspace (endpoint keys, catalogue, data)",
                  ".azureml": "Azure ML's config folder"}
CONFIG_JSON_LIMIT = 1 << 20  # an Azure config.json is a few hundred bytes; a bigger one is not it
# Two names no sensible per-file rule matches: if both are ignored inside a folder, a folder rule ignores it whole.
_PROBES = ("zz-probe.trainbook", "zz-probe-dir/zz-probe.trainbook")


@dataclass(frozen=True)
class CodeUpload:
    """The upload set of a code folder."""

    root: Path
    ignore_file: Path | None  # the .amlignore or .gitignore in force, None if neither exists
    files: tuple[tuple[str, int], ...]  # (path relative to root, bytes), sorted by path

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    def biggest(self, n: int = 5) -> list[tuple[str, int]]:
        """The largest top-level entries (a folder counts everything uploaded under it)."""
        sizes: Counter = Counter()
        for rel, size in self.files:
            head, sep, _ = rel.partition("/")
            sizes[head + ("/" if sep else "")] += size
        return sizes.most_common(n)

    def describe(self) -> str:
        rule = f"filtered by {self.ignore_file.name}" if self.ignore_file else "no .amlignore or .gitignore"
        return f"{self.root}: {len(self.files)} files, {self.total_bytes / MB:.1f} MB ({rule})"


def _prunable(ignore, folder: Path, negations: bool) -> bool:
    """True if the ignore rules drop every file under ``folder``, so the walk need not enter it (.venv alone holds
    tens of thousands of files). The SDK walks them all and drops them one by one; the result is the same."""
    return not negations and all(ignore.is_file_excluded((folder / probe).as_posix()) for probe in _PROBES)


def scan(root: str | Path) -> CodeUpload:
    """List what azure-ai-ml would upload from ``root`` as a job's code."""
    from azure.ai.ml._utils._asset_utils import get_ignore_file, traverse_directory

    root = Path(root).resolve()
    ignore = get_ignore_file(root)
    ignore_path = Path(ignore.path) if ignore.path else None
    rules = ignore_path.read_text(errors="replace").splitlines() if ignore_path else []
    negations = any(line.strip().startswith("!") for line in rules)
    files = []
    for folder, dirnames, filenames in os.walk(root, followlinks=True):  # the SDK follows links too
        here = Path(folder)
        dirnames[:] = [d for d in sorted(dirnames) if not (ignore_path and _prunable(ignore, here / d, negations))]
        prefix = here.relative_to(root).as_posix()
        for source, rel in traverse_directory(folder, filenames, prefix="" if prefix == "." else prefix,
                                              ignore_file=ignore):
            files.append((rel, os.path.getsize(source)))
    return CodeUpload(root, ignore_path, tuple(sorted(files)))


def check(upload: CodeUpload, limit_bytes: int = SNAPSHOT_LIMIT_BYTES,
          limit_files: int = SNAPSHOT_LIMIT_FILES) -> None:
    """Refuse an upload over Azure ML's snapshot limits, one without the toolkit package, or one whose ignore
    file silently drops a file the job needs."""
    root = upload.root
    if not (root / "toolkit" / "__init__.py").is_file():
        raise AzureError(not_allowed(
            "code", root, "the Trainbook project folder", problem="has no toolkit/__init__.py"))
    where = upload.ignore_file.name if upload.ignore_file else ".amlignore"
    biggest = ", ".join(f"{name} {size / MB:.1f} MB" for name, size in upload.biggest())
    if upload.total_bytes > limit_bytes:
        raise AzureError(not_allowed(
            "code", root, f"list the big entries in {where} (data belongs in a data asset)",
            problem=f"would upload {upload.total_bytes / MB:.1f} MB in {len(upload.files)} files, over the "
                    f"{limit_bytes / MB:.0f} MB snapshot limit; biggest: {biggest}"))
    if len(upload.files) > limit_files:
        raise AzureError(not_allowed(
            "code", root, f"list what the job does not need in {where}",
            problem=f"would upload {len(upload.files)} files, over the {limit_files}-file snapshot limit; "
                    f"biggest: {biggest}"))
    uploaded = {rel for rel, _ in upload.files}
    dropped = sorted({p.relative_to(root).as_posix() for pattern in NEEDED for p in root.glob(pattern)
                      if p.is_file()} - uploaded)
    if dropped:
        raise AzureError(refused("code", f"{upload.ignore_file} drops files the job needs: {', '.join(dropped)}",
                                 f"rules in {where} that keep {', '.join(NEEDED[:-1])} and {NEEDED[-1]}"))
    _check_secrets(upload, where)


def _check_secrets(upload: CodeUpload, where: str) -> None:
    """Refuse an upload holding secret-looking files, naming each and the ignore rule that drops it."""
    secrets = secret_files(upload)
    if secrets:
        named = ", ".join(f"{rel} ({what})" for rel, what, _ in secrets[:10])
        more = f" and {len(secrets) - 10} more" if len(secrets) > 10 else ""
        rules = ", ".join(dict.fromkeys(rule for _, _, rule in secrets))
        raise AzureError(not_allowed(
            "code", upload.root, f"exclude them in {where} (add {rules}; a line without a leading '/' matches at "
                                 "any depth), or move them out of the project folder",
            problem=f"would upload secret-looking files: {named}{more}"))


def _workspace_folders(files: set[str]) -> set[str]:
    """Folders holding a Trainbook workspace catalogue, whatever their name (TRAINBOOK_WORKSPACE may be anything)."""
    from toolkit.catalogue.workspace import Workspace

    catalogue = Workspace(Path()).db_path.name  # the workspace's own name for its catalogue, read without opening one
    return {rel.rpartition("/")[0] for rel in files if "/" in rel and rel.rpartition("/")[2] == catalogue}


def _azure_config(path: Path) -> bool:
    """A config.json that names an Azure subscription (what MLClient.from_config reads)."""
    try:
        if path.stat().st_size > CONFIG_JSON_LIMIT:
            return False
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(content, dict) and "subscription_id" in content


def _secret_kind(root: Path, rel: str, workspaces: set[str]) -> tuple[str, str] | None:
    """(what it is, the ignore line that drops it) if the uploaded file ``rel`` looks secret."""
    *folders, name = rel.split("/")
    for depth, folder in enumerate(folders):
        if folder in SECRET_FOLDERS:
            return SECRET_FOLDERS[folder], f"'{folder}/'"
        if (workspace := "/".join(folders[:depth + 1])) in workspaces:
            return SECRET_FOLDERS[".trainbook"], f"'/{workspace}/'"  # that folder only: its name may be common
    if name == "config.json" and _azure_config(root / rel):
        return "an Azure ML workspace config with a subscription_id", "'config.json'"
    return next(((what, f"'{name}'") for pattern, what in SECRET_NAMES if pattern.fullmatch(name)), None)


def secret_files(upload: CodeUpload) -> list[tuple[str, str, str]]:
    """(path, what it is, the ignore line that drops it) for every uploaded file that looks like a secret."""
    workspaces = _workspace_folders({rel for rel, _ in upload.files})
    found = ((rel, _secret_kind(upload.root, rel, workspaces)) for rel, _ in upload.files)
    return [(rel, *kind) for rel, kind in found if kind]


def require(upload: CodeUpload, rel: str, field: str, what: str) -> Path:
    """``rel`` (relative to the code folder) must exist and be uploaded; ``what`` says what it is. Returns its
    path."""
    path = upload.root / rel
    if not path.is_file():
        raise AzureError(not_allowed(field, rel, f"{what} at that path", problem=f"is missing in {str(upload.root)!r}"))
    if rel not in {name for name, _ in upload.files}:
        raise AzureError(not_allowed(
            field, rel, f"rules in {upload.ignore_file.name if upload.ignore_file else '.amlignore'} that keep it",
            problem=f"is dropped by {upload.ignore_file}"))
    return path


# --- the user's model code (model.name=custom): uploaded with the job as its own input -------------------------------

MODEL_CODE = "model-code"  # the plan's folder holding copies of the user's model code; the job's model_code input
CACHES = ("__pycache__",)  # compiled files Python writes beside sources: never needed, never uploaded


@dataclass(frozen=True)
class ModelCode:
    """What a job needs of the user's own code: the files to copy into the plan's model-code folder, and
    model.factory / model.loss as the job reads them (file paths relative to that folder, which the job mounts and
    names as model.code_path)."""

    files: tuple[tuple[str, Path], ...]  # (path inside model-code/, source file)
    factory: str
    loss: str

    @property
    def total_bytes(self) -> int:
        return sum(path.stat().st_size for _, path in self.files)

    def describe(self) -> str:
        tops = sorted({rel.split("/")[0] for rel, _ in self.files})
        return f"{MODEL_CODE}/: {', '.join(tops)} ({len(self.files)} files, {self.total_bytes / MB:.2f} MB)"


def _package_files(top: Path, field: str) -> list[tuple[str, Path]]:
    """Every file of the package folder ``top`` as (path from its parent, path): regular files only, no link
    followed or copied (a link could bring in anything from outside), compiled caches left out."""
    found = []
    for folder, dirnames, filenames in os.walk(top):  # followlinks=False: a linked folder is seen, not entered
        here = Path(folder)
        for name in sorted(dirnames + filenames):
            if (here / name).is_symlink():
                raise AzureError(not_allowed(field, top, "a package of regular files and folders (a link could "
                                                         "upload anything from outside it)",
                                             problem=f"holds {(here / name).relative_to(top.parent)}, a symbolic "
                                                     "link"))
        dirnames[:] = sorted(d for d in dirnames if d not in CACHES)
        found += [((here / n).relative_to(top.parent).as_posix(), here / n) for n in sorted(filenames)
                  if not n.endswith((".pyc", ".pyo"))]
    return found


def model_code(model_cfg, limit_bytes: int = SNAPSHOT_LIMIT_BYTES, limit_files: int = SNAPSHOT_LIMIT_FILES):
    """The user's model code a custom model's job must upload (None for other models): a file path's file, a
    module path's top-level package folder (or module file) from model.code_path (``model_cfg`` is pinned:
    toolkit.train.models.custom.pin). A module of an installed package is not copied: environment.yml installs it.
    Refused: links, files over the snapshot limits, secret-looking files, two different sources of one name."""
    from toolkit.train.models import custom

    if model_cfg.name != "custom":
        return None
    files: dict[str, Path] = {}
    job_specs = {}
    for field, spec in custom.specs(model_cfg):
        where, attr = custom.split_spec(field, spec)
        if custom.is_file_path(where):
            source = Path(where)
            if not source.is_file():
                raise AzureError(not_allowed(field, spec, "a path to a .py file", problem="names no file"))
            entries = [(source.name, source)]
            job_specs[field] = f"{source.name}:{attr}"
        else:
            job_specs[field] = spec
            top = where.partition(".")[0]
            root = Path(model_cfg.code_path) if model_cfg.code_path else None
            if root is None or top == "toolkit":  # installed, or Trainbook itself: the job has it already
                continue
            package, module = root / top, root / f"{top}.py"
            if package.is_dir():
                entries = _package_files(package, field)
            elif module.is_file():
                entries = [(module.name, module)]
            else:
                raise AzureError(not_allowed(field, spec, f"a module under model.code_path={str(root)!r}",
                                             problem=f"is not found there (no {top}/ or {top}.py)"))
        for rel, path in entries:
            if rel in files and files[rel].resolve() != path.resolve():
                raise AzureError(refused(field, f"{spec} brings {rel}, and so does another source ({files[rel]})",
                                         "model.factory and model.loss from one file or package, or files of "
                                         "different names"))
            files[rel] = path
    if not files:
        return None
    total = sum(path.stat().st_size for path in files.values())
    if total > limit_bytes or len(files) > limit_files:
        raise AzureError(refused("model.factory", f"the model code would upload {total / MB:.1f} MB in "
                                                  f"{len(files)} files",
                                 f"at most {limit_bytes / MB:.0f} MB and {limit_files} files (data belongs in a data "
                                 "asset)"))
    workspaces = _workspace_folders(set(files))
    # each file's own root (the folder its relative name starts from), for the checks that read a file's content
    found = ((rel, _secret_kind(path.parents[rel.count("/")], rel, workspaces)) for rel, path in files.items())
    secrets = [(rel, kind[0]) for rel, kind in found if kind]
    if secrets:
        named = ", ".join(f"{files[rel]} ({what})" for rel, what in secrets[:10])
        raise AzureError(refused("model.factory", f"the model code would upload secret-looking files: {named}",
                                 "model code without keys or credentials (move them out of the package)"))
    return ModelCode(tuple(sorted(files.items())), job_specs.get("model.factory", ""), job_specs.get("model.loss", ""))
