"""Setup promises: environment.yml and pyproject agree, torch stays pinned, CI calls the README's test command."""

from __future__ import annotations

import re
import tomllib

import yaml

from conftest import PROJECT


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower().replace("_", "-")


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    pyproject = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((PROJECT / "environment.yml").read_text())
    (pip_section,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    assert sorted(map(_normalise, pip_section)) == sorted(map(_normalise, pyproject))
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert python == ["python=3.11"]


def test_torch_is_pinned_to_the_local_cpu_build_everywhere():
    constraints = (PROJECT / "constraints.txt").read_text().splitlines()
    assert "torch==2.13.0" in constraints
    assert "torch==2.13.0" in (PROJECT / "pyproject.toml").read_text()
    pinned = [line for line in constraints if line and not line.startswith("#")]
    assert all("==" in line for line in pinned), "every constraint is an exact pin"


def test_ci_runs_the_readme_test_command():
    readme = (PROJECT / "README.md").read_text()
    assert "make test" in readme and "make demo" in readme
    ci = (PROJECT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M) and "set -euo pipefail" in ci


def test_the_azure_ml_upload_ignores_everything_git_ignores():
    """Azure ML reads .amlignore instead of .gitignore: a venv or runs/ missing from it would be uploaded."""
    def patterns(name):
        return {line.strip() for line in (PROJECT / name).read_text().splitlines()
                if line.strip() and not line.startswith("#")}

    assert patterns(".gitignore") <= patterns(".amlignore")
    assert ".git/" in patterns(".amlignore")


def test_every_declared_package_is_locked():
    from toolkit.resources import drift

    locked = drift.locked_versions(PROJECT / "constraints.txt")
    assert [name for name in drift.declared_packages(PROJECT / "environment.yml") if name not in locked] == []
