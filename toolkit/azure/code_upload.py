"""What ``code:`` would upload: the project folder filtered the way azure-ai-ml filters it, checked against the
snapshot limit and against the files the job cannot run without.

The SDK's own helpers decide what is ignored (``get_ignore_file``: ``.amlignore`` if present, else ``.gitignore``,
only in the root folder; ``traverse_directory``: which files of a folder survive it), so this check and the real
upload agree.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from toolkit.azure.errors import AzureError

# Azure ML's documented limit for a job's code snapshot ("300 MB and/or 2000 files").
SNAPSHOT_LIMIT_BYTES = 300 * 10**6
SNAPSHOT_LIMIT_FILES = 2000
MB = 10**6  # the SDK reports upload sizes in 10**6 bytes; so do we
NEEDED = ("toolkit/**/*.py", "configs/*.yaml", "pyproject.toml")  # what `python -m toolkit.worker` imports and reads
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
        raise AzureError(f"code: {str(root)!r} has no toolkit/__init__.py; allowed: the Trainbook project folder")
    where = upload.ignore_file.name if upload.ignore_file else ".amlignore"
    biggest = ", ".join(f"{name} {size / MB:.1f} MB" for name, size in upload.biggest())
    if upload.total_bytes > limit_bytes:
        raise AzureError(f"code: {str(root)!r} would upload {upload.total_bytes / MB:.1f} MB in {len(upload.files)} "
                         f"files, over the {limit_bytes / MB:.0f} MB snapshot limit; biggest: {biggest}; allowed: "
                         f"list the big entries in {where} (data belongs in a data asset)")
    if len(upload.files) > limit_files:
        raise AzureError(f"code: {str(root)!r} would upload {len(upload.files)} files, over the {limit_files}-file "
                         f"snapshot limit; biggest: {biggest}; allowed: list what the job does not need in {where}")
    uploaded = {rel for rel, _ in upload.files}
    dropped = sorted({p.relative_to(root).as_posix() for pattern in NEEDED for p in root.glob(pattern)
                      if p.is_file()} - uploaded)
    if dropped:
        raise AzureError(f"code: {upload.ignore_file} drops files the job needs: {', '.join(dropped)}; allowed: "
                         f"rules in {where} that keep toolkit/**/*.py, configs/*.yaml and pyproject.toml")


def require(upload: CodeUpload, rel: str, field: str, what: str) -> Path:
    """``rel`` (relative to the code folder) must exist and be uploaded; ``what`` says what it is. Returns its
    path."""
    path = upload.root / rel
    if not path.is_file():
        raise AzureError(f"{field}: {rel!r} is missing in {str(upload.root)!r}; allowed: {what} at that path")
    if rel not in {name for name, _ in upload.files}:
        raise AzureError(f"{field}: {rel!r} is dropped by {upload.ignore_file}; allowed: rules in "
                         f"{upload.ignore_file.name if upload.ignore_file else '.amlignore'} that keep it")
    return path
