"""Environment drift: are the packages environment.yml names installed, at the versions constraints.txt locks?

Drift is the guide's most common cause of "it worked yesterday": a node or a laptop whose torch or DeepSpeed
is not the one the run was developed with. The lock (constraints.txt) says what was tested.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UserError, not_allowed
from toolkit.paths import PROJECT_ROOT

ENVIRONMENT_FILE = PROJECT_ROOT / "environment.yml"
LOCK_FILE = PROJECT_ROOT / "constraints.txt"


class EnvironmentFileError(UserError, ValueError):
    """environment.yml cannot be read; the message names the file and the problem."""


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(spec: str) -> str:
    return _normalise(re.split(r"[<>=!~\[; ]", spec.strip(), maxsplit=1)[0])


def declared_packages(path: Path = ENVIRONMENT_FILE, field: str = "environment.yml") -> list[str]:
    """The pip packages of a conda environment file (what an Azure ML Environment is built from); ``field``
    is what the error messages call the file (e.g. the --conda-file flag)."""
    import yaml

    allowed = "a conda environment file with a 'dependencies' list and a 'pip:' section"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EnvironmentFileError(not_allowed(field, path, allowed, problem="does not exist")) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise EnvironmentFileError(
            not_allowed(field, path, allowed, problem=f"is not valid YAML ({where}{getattr(exc, 'problem', exc)})")
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EnvironmentFileError(not_allowed(field, path, allowed, problem=f"cannot be read ({exc})")) from None
    deps = data.get("dependencies") if isinstance(data, dict) else None
    if not isinstance(deps, list):
        raise EnvironmentFileError(not_allowed(field, path, allowed, problem="has no dependencies list"))
    pip = [d["pip"] for d in deps if isinstance(d, dict) and "pip" in d]
    if not pip or not isinstance(pip[0], list):
        raise EnvironmentFileError(not_allowed(field, path, allowed, problem="has no 'pip:' list under dependencies"))
    return [_requirement_name(spec) for spec in pip[0]]


def locked_versions(path: Path = LOCK_FILE) -> dict[str, str]:
    locked = {}
    for line in Path(path).read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and not name.startswith("#"):
            locked[_normalise(name)] = version.strip()
    return locked


@dataclass(frozen=True)
class PackageState:
    name: str
    locked: str | None
    installed: str | None

    @property
    def status(self) -> str:
        if self.installed is None:
            return "missing"
        if self.locked is None:
            return "unlocked"
        # a local build tag (torch 2.13.0+cpu) is the same release as the lock's 2.13.0
        return "ok" if self.installed.split("+")[0] == self.locked.split("+")[0] else "drift"


def installed_requirements(distribution: str = "trainbook") -> list[str]:
    """The core requirements an installed distribution's metadata declares (names only, extras left out)."""
    requires = importlib.metadata.requires(distribution) or []
    return [_requirement_name(spec) for spec in requires if "extra ==" not in spec]


def check(environment: Path = ENVIRONMENT_FILE, lock: Path = LOCK_FILE) -> list[PackageState]:
    """One row per package environment.yml declares."""
    return _states(declared_packages(environment), locked_versions(lock) if Path(lock).exists() else {})


def check_installed() -> list[PackageState]:
    """A wheel install has no environment.yml or lock beside it: one row per core requirement of the installed
    trainbook, none of them locked."""
    return _states(installed_requirements(), {})


def _states(names: list[str], locked: dict[str, str]) -> list[PackageState]:
    states = []
    for name in names:
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        states.append(PackageState(name, locked.get(name), installed))
    return states
