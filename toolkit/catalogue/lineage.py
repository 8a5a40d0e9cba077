"""What a run was made from: data, code, packages, machine (written to lineage.json by rank 0)."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys

from toolkit.paths import PROJECT_ROOT

PACKAGES = ("torch", "deepspeed", "numpy", "tensorboard", "trainbook")
REPO = PROJECT_ROOT


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def collect_lineage(cfg, corpus, world_size: int) -> dict:
    return {
        "data": {
            "name": corpus.name,
            "sha256": corpus.sha256,
            "size_bytes": corpus.size_bytes,
            "asset": corpus.asset,
            "tokenizer": corpus.tokenizer,
            **({"label_names": corpus.label_names} if corpus.label_names else {}),
            **({"dropped_examples": corpus.dropped} if corpus.dropped else {}),
        },
        "config_sha256": cfg.fingerprint(),
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "host": {"name": platform.node(), "platform": platform.platform(), "machine": platform.machine()},
        "world_size": world_size,
    }
