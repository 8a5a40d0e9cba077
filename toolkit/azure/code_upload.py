"""What ``code:`` would upload: the project folder filtered the way azure-ai-ml filters it, checked against the
snapshot limit, against the files the job cannot run without, and against secrets (a code snapshot is readable by
everyone with access to the Azure ML workspace, and kept with every job): secrets by folder, by name and by content
(the first HEAD_BYTES of each text file), and links leading out of the project, which the SDK follows.

The SDK's own helpers decide what is ignored (``get_ignore_file``: ``.amlignore`` if present, else ``.gitignore``,
only in the root folder; ``traverse_directory``: which files of a folder survive it), so this check and the real
upload agree.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from toolkit.azure.errors import AzureError
from toolkit.errors import not_allowed, refused

# Azure ML's documented limit for a job's code snapshot ("300 MB and/or 2000 files").
SNAPSHOT_LIMIT_BYTES = 300 * 10**6
SNAPSHOT_LIMIT_FILES = 2000
MB = 10**6  # the SDK reports upload sizes in 10**6 bytes; so do we
# what `python -m toolkit.runs.worker` imports and reads
NEEDED = ("toolkit/**/*.py", "toolkit/configs/*.yaml", "pyproject.toml")
_BACKUP = r"(\.(bak|old|orig|save|backup)|~)?"  # a copy's suffix: id_rsa.bak is still the key
_NOT_CODE = r"(?!.*\.(py|pyi|ipynb|md|rst)$)"  # code and docs about secrets (api_keys.py) are judged by content
# Secret-looking files, by name: (pattern over the whole basename, any case; what it is). Endpoint keys are files
# named `key` (toolkit.deploy.serving.endpoint); the rest are the usual key, certificate, login and environment files.
SECRET_NAMES = tuple(
    (re.compile(pattern, re.IGNORECASE), what)
    for pattern, what in (
        (r"key", "an endpoint key"),
        (rf".*\.(pem|key){_BACKUP}", "a private key or certificate"),
        (rf".*\.(pfx|p12){_BACKUP}", "a certificate bundle with its private key"),
        (rf".*\.ppk{_BACKUP}", "a PuTTY private key"),
        (r"id_(rsa|dsa|ecdsa|ed25519).*", "an SSH key"),
        (r"\.env.*|.*\.env", "an environment file (often holds credentials)"),
        (rf"[._]netrc{_BACKUP}", "a netrc file (logins and passwords)"),
        (rf"\.git-credentials{_BACKUP}", "git's credential store"),
        (rf"\.pypirc{_BACKUP}", "a PyPI config (upload credentials)"),
        (rf"(\.pgpass|\.htpasswd){_BACKUP}", "a password file"),
        (rf"{_NOT_CODE}credentials(\..*)?", "a credentials file"),
        (rf"{_NOT_CODE}.*(secret|api[_-]?key|access[_-]?token).*", "a file named for a secret"),
    )
)
HEAD_BYTES = 64 * 1024  # what is read of a file: keys and logins sit at the top; x SNAPSHOT_LIMIT_FILES bounds the work
_KEY_BODY = r"(?:\r?\n|\\n)(?:Proc-Type:|[A-Za-z0-9+/=]{16})"  # a header with a key after it, not code naming one
_VALUE = r"""(?:"[^"\s<>${}]{8,}"|'[^'\s<>${}]{8,}'|[^\s"'<>${}()\[\],;]{8,}[ \t]*$)"""  # a literal, not a variable
# Secrets by content, whatever the file's name: (marker, pattern over the file's head, what the file holds). A pattern
# runs only on a head holding its marker (any case), and starts with a literal where it can (a regex searches for a
# leading literal fast, for anything else slowly). Each pattern needs a value after its marker, so code and docs that
# name the marker (this file, its tests) are no secret.
CONTENT_SECRETS = tuple(
    (marker, re.compile(pattern, re.MULTILINE), what)
    for marker, pattern, what in (
        ("private key-----", r"-----BEGIN OPENSSH PRIVATE KEY-----" + _KEY_BODY, "an OpenSSH private key"),
        ("private key", r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----" + _KEY_BODY, "a PEM private key"),
        ("putty-user-key-file-", r"PuTTY-User-Key-File-\d+: \S+\r?\n", "a PuTTY private key"),
        ("accountkey=", r"AccountKey=[A-Za-z0-9+/]{20,}", "an Azure connection string with its key"),
        ("sharedaccesskey=", r"SharedAccessKey=[A-Za-z0-9+/]{20,}", "an Azure connection string with its key"),
        ("sig=", r"sig=[A-Za-z0-9%+/]{30,}", "an Azure shared access signature"),
        ("secret", r"(?i)client[_-]?secret[\"']?[ \t]*[:=][ \t]*" + _VALUE, "a client secret"),
        ("akia", r"AKIA[0-9A-Z]{16}(?![0-9A-Z])", "an AWS access key"),
        (
            "aws_secret_access_key",
            r"(?i)aws_secret_access_key[ \t]*[:=][ \t]*[\"']?[A-Za-z0-9/+]{40}",
            "an AWS secret key",
        ),
        # a netrc entry starts a line or follows a space, not a quote: a string in code is no netrc
        (
            "password",
            r"(?:machine(?<!\Smachine)[ \t]+\S+|default(?<!\Sdefault)(?=\s+login))"
            r"(?:\s+(?:login|account)\s+\S+)*\s+password\s+\S+",
            "netrc logins (machine ... password)",
        ),
        # a password of 8 or more: a token, not an example such as https://me:secret@host in a test
        ("://", r"://[^\s:/@'\"<>${}]+:[^\s/@'\"<>${}]{8,}@[A-Za-z0-9.-]+", "a URL with a password in it"),
        ("gh", r"gh[pousr]_[A-Za-z0-9]{36,}", "a GitHub token"),
        ("pypi-", r"pypi-[A-Za-z0-9_-]{50,}", "a PyPI token"),
        ("xox", r"xox[abprs]-[A-Za-z0-9-]{10,}", "a Slack token"),
    )
)
# Beside a secret, a subscription id makes the file a whole login to an Azure subscription (az ad sp --sdk-auth).
SUBSCRIPTION = re.compile(r"(?i)subscription[_-]?id[\"']?\s*[:=]")
# Folders whose every file is a secret or private: Trainbook workspaces (keys, the catalogue, data) and the Azure ML
# config folder that MLClient.from_config reads.
SECRET_FOLDERS = {
    ".trainbook": "a Trainbook workspace (endpoint keys, catalogue, data)",
    ".azureml": "Azure ML's config folder",
}
# Two names no sensible per-file rule matches: if both are ignored inside a folder, a folder rule ignores it whole.
_PROBES = ("zz-probe.trainbook", "zz-probe-dir/zz-probe.trainbook")


@dataclass(frozen=True)
class CodeUpload:
    """The upload set of a code folder."""

    root: Path
    ignore_file: Path | None  # the .amlignore or .gitignore in force, None if neither exists
    files: tuple[tuple[str, int], ...]  # (path relative to root, bytes), sorted by path
    # (link relative to root, '/' after a folder's; where it really leads): links out of root, never followed
    links_out: tuple[tuple[str, str], ...] = ()

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
    tens of thousands of files). The SDK walks them all and drops them one by one; the result is the same, but
    for linked folders under it (see _links_out_under)."""
    return not negations and all(ignore.is_file_excluded((folder / probe).as_posix()) for probe in _PROBES)


def _leads_out(root: Path, path: Path) -> str | None:
    """Where ``path`` really leads, if it is a link that leads out of ``root``."""
    if not os.path.islink(path):
        return None  # walked from root through links inside it only, so a plain entry is inside
    real = os.path.realpath(path)
    return None if Path(real).is_relative_to(root) else real


def _link_out(root: Path, path: Path, target: str) -> tuple[str, str]:
    """An entry of CodeUpload.links_out."""
    return path.relative_to(root).as_posix() + ("/" if os.path.isdir(path) else ""), target


def _links_out_under(root: Path, folder: Path) -> list[tuple[str, str]]:
    """Linked folders leading out of ``root`` anywhere under ``folder``, a folder the ignore rules drop whole: the
    SDK walks it all the same, follows such a link and judges the ignore rules by where it leads (outside, so
    nothing drops it), uploading what it leads to. Linked files under it are judged by their own path: dropped."""
    found = []
    for here, dirnames, _ in os.walk(folder):  # followlinks=False: a linked folder is listed, never entered
        found += [
            _link_out(root, Path(here) / d, target) for d in dirnames if (target := _leads_out(root, Path(here) / d))
        ]
    return found


def scan(root: str | Path) -> CodeUpload:
    """List what azure-ai-ml would upload from ``root`` as a job's code."""
    from azure.ai.ml._utils._asset_utils import get_ignore_file, traverse_directory

    root = Path(root).resolve()
    ignore = get_ignore_file(root)
    ignore_path = Path(ignore.path) if ignore.path else None
    rules = ignore_path.read_text(errors="replace").splitlines() if ignore_path else []
    negations = any(line.strip().startswith("!") for line in rules)
    files, links_out = [], []
    # The SDK follows links too; this walk follows those inside root only (whatever the ignore rules say of a link
    # leading out, the SDK would upload what it leads to: see _links_out_under)
    for folder, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(folder)
        walked = []
        for name in sorted(dirnames):
            if target := _leads_out(root, here / name):
                links_out.append(_link_out(root, here / name, target))
            elif ignore_path and _prunable(ignore, here / name, negations):
                links_out += _links_out_under(root, here / name)
            else:
                walked.append(name)
        dirnames[:] = walked
        prefix = here.relative_to(root).as_posix()
        for source, rel in traverse_directory(
            folder, filenames, prefix="" if prefix == "." else prefix, ignore_file=ignore
        ):
            if target := _leads_out(root, root / rel):
                links_out.append(_link_out(root, root / rel, target))
            else:
                files.append((rel, os.path.getsize(source)))
    return CodeUpload(root, ignore_path, tuple(sorted(files)), tuple(sorted(links_out)))


def check(upload: CodeUpload, limit_bytes: int = SNAPSHOT_LIMIT_BYTES, limit_files: int = SNAPSHOT_LIMIT_FILES) -> None:
    """Refuse an upload over Azure ML's snapshot limits, one without the toolkit package, or one whose ignore
    file silently drops a file the job needs."""
    root = upload.root
    if not (root / "toolkit" / "__init__.py").is_file():
        raise AzureError(
            not_allowed("code", root, "the Trainbook project folder", problem="has no toolkit/__init__.py")
        )
    where = upload.ignore_file.name if upload.ignore_file else ".amlignore"
    biggest = ", ".join(f"{name} {size / MB:.1f} MB" for name, size in upload.biggest())
    if upload.total_bytes > limit_bytes:
        raise AzureError(
            not_allowed(
                "code",
                root,
                f"list the big entries in {where} (data belongs in a data asset)",
                problem=f"would upload {upload.total_bytes / MB:.1f} MB in {len(upload.files)} files, over the "
                f"{limit_bytes / MB:.0f} MB snapshot limit; biggest: {biggest}",
            )
        )
    if len(upload.files) > limit_files:
        raise AzureError(
            not_allowed(
                "code",
                root,
                f"list what the job does not need in {where}",
                problem=f"would upload {len(upload.files)} files, over the {limit_files}-file snapshot limit; "
                f"biggest: {biggest}",
            )
        )
    uploaded = {rel for rel, _ in upload.files}
    dropped = sorted(
        {p.relative_to(root).as_posix() for pattern in NEEDED for p in root.glob(pattern) if p.is_file()} - uploaded
    )
    if dropped:
        raise AzureError(
            refused(
                "code",
                f"{upload.ignore_file} drops files the job needs: {', '.join(dropped)}",
                f"rules in {where} that keep {', '.join(NEEDED[:-1])} and {NEEDED[-1]}",
            )
        )
    _check_secrets(upload, where)


def _check_secrets(upload: CodeUpload, where: str) -> None:
    """Refuse an upload holding secret-looking files or links out of the project, naming each, why, and the ignore
    rule that drops it (none drops a linked folder)."""
    secrets = secret_files(upload)
    if secrets:
        named = ", ".join(f"{rel} ({what})" for rel, what, _ in secrets[:10])
        more = f" and {len(secrets) - 10} more" if len(secrets) > 10 else ""
        rules = ", ".join(dict.fromkeys(rule for _, _, rule in secrets if rule))
        exclude = (
            f"exclude them in {where} (add {rules}; a line without a leading '/' matches at any depth), or "
            if rules
            else ""
        )
        raise AzureError(
            not_allowed(
                "code",
                upload.root,
                f"{exclude}move them out of the project folder",
                problem=f"would upload secret-looking files: {named}{more}",
            )
        )


def _workspace_folders(files: set[str]) -> set[str]:
    """Folders holding a Trainbook workspace catalogue, whatever their name (TRAINBOOK_WORKSPACE may be anything)."""
    from toolkit.catalogue.workspace import Workspace

    catalogue = Workspace(Path()).db_path.name  # the workspace's own name for its catalogue, read without opening one
    return {rel.rpartition("/")[0] for rel in files if "/" in rel and rel.rpartition("/")[2] == catalogue}


def _azure_config(head: str) -> bool:
    """A config.json that names an Azure subscription (what MLClient.from_config reads; a few hundred bytes, so
    one longer than its head is not it)."""
    try:
        content = json.loads(head)
    except ValueError:
        return False
    return isinstance(content, dict) and "subscription_id" in content


def _head(path: Path) -> str | None:
    """The first HEAD_BYTES of a regular file as text (latin-1: any bytes decode); None for a binary file (a NUL in
    its head), anything but a regular file, or one this user cannot read (neither can the upload)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO never blocks the check
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        head = file.read(HEAD_BYTES) if stat.S_ISREG(os.fstat(fd).st_mode) else b"\0"
    return None if b"\0" in head else head.decode("latin-1")


def secret_in_name(name: str) -> str | None:
    """What a file named ``name`` (a basename) is, if its name says it holds a secret."""
    return next((what for pattern, what in SECRET_NAMES if pattern.fullmatch(name)), None)


def secret_in_content(text: str) -> str | None:
    """What secret ``text`` (a file's head) holds, if any."""
    lower = text.lower()
    found = next((what for marker, pattern, what in CONTENT_SECRETS if marker in lower and pattern.search(text)), None)
    return f"{found} beside an Azure subscription id" if found and SUBSCRIPTION.search(text) else found


def _secret_kind(root: Path, rel: str, workspaces: set[str]) -> tuple[str, str] | None:
    """(what it is, the ignore line that drops it) if the uploaded file ``rel`` looks secret."""
    *folders, name = rel.split("/")
    for depth, folder in enumerate(folders):
        if folder in SECRET_FOLDERS:
            return SECRET_FOLDERS[folder], f"'{folder}/'"
        if (workspace := "/".join(folders[: depth + 1])) in workspaces:
            return SECRET_FOLDERS[".trainbook"], f"'/{workspace}/'"  # that folder only: its name may be common
    if what := secret_in_name(name):
        return what, f"'{name}'"
    head = _head(root / rel)
    if head is None:
        return None
    if name == "config.json" and _azure_config(head):
        return "an Azure ML workspace config with a subscription_id", "'config.json'"
    what = secret_in_content(head)
    return (f"holds {what}", f"'/{rel}'") if what else None  # that file only: its name says nothing


def _link_kind(root: Path, rel: str, workspaces: set[str]) -> tuple[str, str] | None:
    """A link inside the project is judged by where it leads too: a harmless name for a workspace's key, which
    the ignore rules drop at its own path but not through the link."""
    real = (root / rel).resolve()
    if real == root / rel or not real.is_relative_to(root):
        return None
    kind = _secret_kind(root, real.relative_to(root).as_posix(), workspaces)
    return kind and (f"a link to {real.relative_to(root).as_posix()}, {kind[0]}", f"'/{rel}'")


def _link_out_kind(rel: str, target: str) -> tuple[str, str | None]:
    """What a link out of the project is, and the ignore line that drops it: none for a folder, which the SDK
    follows whatever the ignore file says."""
    if rel.endswith("/"):
        return f"a link to {target}, outside the project, followed whatever the ignore file says", None
    return f"a link to {target}, outside the project", f"'/{rel}'"


def secret_files(upload: CodeUpload) -> list[tuple[str, str, str | None]]:
    """(path, what it is, the ignore line that drops it, None if none does) for every uploaded file that looks like
    a secret and every link out of the project."""
    workspaces = _workspace_folders({rel for rel, _ in upload.files})
    found = [
        (rel, _secret_kind(upload.root, rel, workspaces) or _link_kind(upload.root, rel, workspaces))
        for rel, _ in upload.files
    ]
    found += [(rel, _link_out_kind(rel, target)) for rel, target in upload.links_out]
    return sorted(((rel, *kind) for rel, kind in found if kind), key=lambda secret: secret[0])


def require(upload: CodeUpload, rel: str, field: str, what: str) -> Path:
    """``rel`` (relative to the code folder) must exist and be uploaded; ``what`` says what it is. Returns its
    path."""
    path = upload.root / rel
    if not path.is_file():
        raise AzureError(not_allowed(field, rel, f"{what} at that path", problem=f"is missing in {str(upload.root)!r}"))
    if rel not in {name for name, _ in upload.files}:
        raise AzureError(
            not_allowed(
                field,
                rel,
                f"rules in {upload.ignore_file.name if upload.ignore_file else '.amlignore'} that keep it",
                problem=f"is dropped by {upload.ignore_file}",
            )
        )
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


def _refuse_link(field: str, shown: Path, path: Path, base: Path) -> None:
    """No link is followed or copied into the model code: a link could bring in anything from outside."""
    if path.is_symlink():
        raise AzureError(
            not_allowed(
                field,
                shown,
                "regular files and folders (a link could upload anything from outside them)",
                problem=f"holds {path.relative_to(base)}, a symbolic link",
            )
        )


def _package_files(top: Path, field: str) -> list[tuple[str, Path]]:
    """Every file of the package folder ``top`` as (path from its parent, path): regular files only, no link
    followed or copied, compiled caches left out."""
    found = []
    for folder, dirnames, filenames in os.walk(top):  # followlinks=False: a linked folder is seen, not entered
        here = Path(folder)
        for name in sorted(dirnames + filenames):
            _refuse_link(field, top, here / name, top.parent)
        dirnames[:] = sorted(d for d in dirnames if d not in CACHES)
        found += [
            ((here / n).relative_to(top.parent).as_posix(), here / n)
            for n in sorted(filenames)
            if not n.endswith((".pyc", ".pyo"))
        ]
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
                _refuse_link(field, root, module, root)
                entries = [(module.name, module)]
            else:
                raise AzureError(
                    not_allowed(
                        field,
                        spec,
                        f"a module under model.code_path={str(root)!r}",
                        problem=f"is not found there (no {top}/ or {top}.py)",
                    )
                )
        for rel, path in entries:
            if rel in files and files[rel].resolve() != path.resolve():
                raise AzureError(
                    refused(
                        field,
                        f"{spec} brings {rel}, and so does another source ({files[rel]})",
                        "model.factory and model.loss from one file or package, or files of different names",
                    )
                )
            files[rel] = path
    if not files:
        return None
    total = sum(path.stat().st_size for path in files.values())
    if total > limit_bytes or len(files) > limit_files:
        raise AzureError(
            refused(
                "model.factory",
                f"the model code would upload {total / MB:.1f} MB in {len(files)} files",
                f"at most {limit_bytes / MB:.0f} MB and {limit_files} files (data belongs in a data asset)",
            )
        )
    workspaces = _workspace_folders(set(files))
    # each file's own root (the folder its relative name starts from), for the checks that read a file's content
    found = ((rel, _secret_kind(path.parents[rel.count("/")], rel, workspaces)) for rel, path in files.items())
    secrets = [(rel, kind[0]) for rel, kind in found if kind]
    if secrets:
        named = ", ".join(f"{files[rel]} ({what})" for rel, what in secrets[:10])
        raise AzureError(
            refused(
                "model.factory",
                f"the model code would upload secret-looking files: {named}",
                "model code without keys or credentials (move them out of the package)",
            )
        )
    return ModelCode(tuple(sorted(files.items())), job_specs.get("model.factory", ""), job_specs.get("model.loss", ""))
