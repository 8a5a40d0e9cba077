"""environment.yml, the conda environment of the Azure ML job and serving images, written from the lock.

    python -m toolkit.resources.job_environment     # `make lock` runs it right after re-pinning constraints.txt

The cluster must run the versions `make setup` installs and the doctor validated, not whatever PyPI resolves on the
day the image is built. So environment.yml is not written by hand: it is pyproject.toml's core dependencies plus the
job image extras (toolkit.extras.JOB_IMAGE_EXTRAS), with everything they pull in, each pinned to its version in
constraints.txt. What they pull in is read from the installed distributions' own metadata (their requirements and
markers, followed through requested extras), evaluated for this interpreter: the image runs the same Python on Linux.
"""

from __future__ import annotations

import importlib.metadata
import sys
import tomllib
from pathlib import Path

from toolkit import fsio
from toolkit.errors import UserError, refused
from toolkit.paths import PROJECT_ROOT
from toolkit.resources.drift import ENVIRONMENT_FILE, LOCK_FILE, PackageState, locked_versions

PYPROJECT = PROJECT_ROOT / "pyproject.toml"
# pip freeze leaves the installer's own tools out of the lock, and conda's pip brings them into the image.
INSTALLER_TOOLS = frozenset({"pip", "setuptools", "wheel"})
HEADER = """\
# The conda environment of Trainbook's Azure ML Environments: what `trainbook azure plan` (on an ACPT image) and
# `azure deploy-plan` put in the job and serving images. WRITTEN BY `make lock` (python -m
# toolkit.resources.job_environment) from constraints.txt: do not edit it, change pyproject.toml and run `make lock`.
# It pins pyproject.toml's core dependencies, its job image extras and every package they need to their locked
# versions, so the cluster runs what `make setup` installs; no notebook or test tools (tests/e2e/test_packaging.py
# checks). pip, setuptools and wheel are the image's own. torch=={torch} is the CPU build on a workstation and the
# CUDA build from PyPI on the cluster, which pins its own nvidia-* wheels.
# Job image extras: {extras}
"""


class LockError(UserError, ValueError):
    """The lock and the installed packages do not give a complete, consistent environment; the message says which
    package and what to run."""


def root_requirements(extras: tuple[str, ...], pyproject: Path = PYPROJECT) -> list[str]:
    """pyproject.toml's core dependencies and those of ``extras``, as written there."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    optional = project.get("optional-dependencies", {})
    unknown = [extra for extra in extras if extra not in optional]
    if unknown:
        raise LockError(
            refused(
                "JOB_IMAGE_EXTRAS",
                f"names {', '.join(unknown)}, which {pyproject} does not define",
                f"extras of pyproject.toml: {', '.join(optional)}",
            )
        )
    return list(project["dependencies"]) + [req for extra in extras for req in optional[extra]]


def closure(requirements: list[str]) -> list[str]:
    """The normalised names of ``requirements`` and of everything they need, by the installed distributions'
    metadata, without INSTALLER_TOOLS; sorted."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    wanted: dict[str, set[str]] = {}  # name -> the extras asked of it (its requirements follow them)
    pending = [Requirement(spec) for spec in requirements]
    while pending:
        req = pending.pop()
        name = canonicalize_name(req.name)
        if name in INSTALLER_TOOLS or (name in wanted and set(req.extras) <= wanted[name]):
            continue
        extras = wanted.setdefault(name, set())
        extras.update(req.extras)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            raise LockError(
                refused(
                    name,
                    "is needed by the job image but is not installed here, so its own requirements are unknown",
                    "run `make setup`, then `make lock`",
                )
            ) from None
        for spec in requires:
            dep = Requirement(spec)
            # a requirement without a marker, or one whose marker holds here for the base package or an asked extra
            if dep.marker is None or any(dep.marker.evaluate({"extra": extra}) for extra in extras | {""}):
                pending.append(dep)
    return sorted(wanted)


def pins(names: list[str], lock: Path = LOCK_FILE) -> list[str]:
    """``name==version`` for each of ``names`` at its version in ``lock``. A package missing from the lock, or
    installed at another version (its requirements, read from what is installed, may not be the locked ones), is
    refused."""
    locked = locked_versions(lock)
    out = []
    for name in names:
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        state = PackageState(name, locked.get(name), installed)
        if state.locked is None:
            raise LockError(
                refused(
                    name,
                    f"is needed by the job image but {lock.name} does not pin it",
                    "run `make lock` (it re-pins everything installed)",
                )
            )
        if state.status != "ok":
            raise LockError(
                refused(
                    name,
                    f"is installed at {installed}, {lock.name} pins {state.locked}",
                    "run `make setup` (it installs the locked versions), then `make lock`",
                )
            )
        out.append(f"{name}=={state.locked}")
    return out


def environment_text(pinned: list[str], extras: tuple[str, ...]) -> str:
    """environment.yml's text: the header, this interpreter's Python, pip, and ``pinned``."""
    torch = next((pin.partition("==")[2] for pin in pinned if pin.startswith("torch==")), "?")
    lines = [
        HEADER.format(extras=", ".join(extras), torch=torch).rstrip("\n"),
        "name: trainbook",
        "channels:",
        "  - conda-forge",
        "dependencies:",
        f"  - python={sys.version_info.major}.{sys.version_info.minor}",
        "  - pip",
        "  - pip:",
        *[f"      - {pin}" for pin in pinned],
    ]
    return "\n".join(lines) + "\n"


def job_image_pins(lock: Path = LOCK_FILE, pyproject: Path = PYPROJECT) -> list[str]:
    """What environment.yml pins: the job image's packages and everything they need, at their locked versions."""
    from toolkit.extras import JOB_IMAGE_EXTRAS

    return pins(closure(root_requirements(JOB_IMAGE_EXTRAS, pyproject)), lock)


def write(path: Path = ENVIRONMENT_FILE, lock: Path = LOCK_FILE, pyproject: Path = PYPROJECT) -> list[str]:
    """Write environment.yml (atomically: a failed run leaves the old one); returns its pins."""
    from toolkit.extras import JOB_IMAGE_EXTRAS

    pinned = job_image_pins(lock, pyproject)
    fsio.atomic_write_text(Path(path), environment_text(pinned, JOB_IMAGE_EXTRAS))
    return pinned


def main() -> int:
    try:
        pinned = write()
    except LockError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{ENVIRONMENT_FILE.name}: {len(pinned)} packages pinned to {LOCK_FILE.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
