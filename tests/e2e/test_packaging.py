"""Setup promises: environment.yml pins pyproject's core plus the job image extras (and all they need) to the lock,
torch stays pinned, CI calls the README's test command, and a wheel carries the built-in configs."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile

import pytest
import yaml

from conftest import PROJECT
from toolkit import config
from toolkit.resources import drift


def _normalise(requirement: str) -> str:
    return re.sub(r"\s+", "", requirement).lower().replace("_", "-")


def _requirements() -> tuple[list[str], dict[str, list[str]]]:
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    return project["dependencies"], project["optional-dependencies"]


def _environment_pip() -> list[str]:
    env = yaml.safe_load((PROJECT / "environment.yml").read_text())
    (pip_section,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    return pip_section


def test_environment_yml_pins_the_job_image_closure_to_the_lock():
    """The Azure ML job and serving image (built from environment.yml) runs the versions `make setup` installs:
    pyproject's core plus the job image extras and everything they need, each at its constraints.txt version, and
    no notebook or test tools. `make lock` writes it; this fails when it was not run after a change."""
    from toolkit.extras import JOB_IMAGE_EXTRAS
    from toolkit.resources import job_environment

    locked = drift.locked_versions(PROJECT / "constraints.txt")
    assert [spec for spec in _environment_pip() if spec.count("==") != 1] == [], "every package is pinned"
    pinned = dict(pin.split("==") for pin in _environment_pip())
    stale = "environment.yml is older than the lock: run `make lock` (python -m toolkit.resources.job_environment)"
    assert {name: version for name, version in pinned.items() if locked.get(name) != version} == {}, stale
    assert list(pinned) == sorted(pinned) and all(name == drift._requirement_name(name) for name in pinned)
    core, optional = _requirements()
    roots = {drift._requirement_name(req) for req in core + [r for e in JOB_IMAGE_EXTRAS for r in optional[e]]}
    closure = job_environment.closure(job_environment.root_requirements(JOB_IMAGE_EXTRAS))
    assert roots <= set(pinned) and sorted(pinned) == closure, stale
    assert {"azure-core", "huggingface-hub", "jinja2"} <= set(pinned), "transitive requirements are pinned too"
    assert pinned["torch"] == "2.13.0"
    env = yaml.safe_load((PROJECT / "environment.yml").read_text())
    python = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python")]
    assert python == [f"python={sys.version_info.major}.{sys.version_info.minor}"]
    workstation_only = {"jupyterlab", "pytest", "papermill", "playwright", "nbval", "ipywidgets", "pytest-xdist"}
    assert workstation_only.isdisjoint(pinned)
    assert re.search(r"^lock:.*\n(\t.*\n)*\t\$\(PY\) -m toolkit\.resources\.job_environment$",
                     (PROJECT / "Makefile").read_text(), re.M), "make lock writes it"


def test_make_lock_writes_this_environment_yml_and_refuses_a_lock_that_misses_or_moves_a_package(tmp_path):
    from toolkit.resources import job_environment

    written = tmp_path / "environment.yml"
    job_environment.write(written, PROJECT / "constraints.txt")
    assert written.read_text() == (PROJECT / "environment.yml").read_text(), "run `make lock`"
    written.unlink()
    lock, text = tmp_path / "constraints.txt", (PROJECT / "constraints.txt").read_text()
    lock.write_text(re.sub(r"(?mi)^jinja2==.*\n", "", text))
    with pytest.raises(job_environment.LockError, match=r"^jinja2: is needed by the job image but constraints.txt "
                                                        r"does not pin it; allowed: run `make lock`"):
        job_environment.write(written, lock)
    lock.write_text(re.sub(r"(?mi)^jinja2==.*$", "Jinja2==0.1", text))
    with pytest.raises(job_environment.LockError, match=r"^jinja2: is installed at 3\.\S+, constraints.txt pins 0.1; "
                                                        r"allowed: run `make setup`"):
        job_environment.write(written, lock)
    assert not written.exists(), "nothing half-written"


def test_the_all_extra_is_every_extra_and_make_setup_installs_it():
    _, optional = _requirements()
    (everything,) = optional["all"]
    named = set(everything.removeprefix("trainbook[").removesuffix("]").split(","))
    assert named == set(optional) - {"all"}
    # the commands `make setup` runs on a fresh machine, as make spells them out (-n: printed, not run)
    setup = subprocess.run(["make", "-n", "-B", "setup"], capture_output=True, text=True, cwd=PROJECT, check=True)
    assert re.search(r'pip install .*-c constraints\.txt -e "\.\[all\]"', setup.stdout), setup.stdout


def test_torch_is_a_range_for_the_library_and_pinned_to_the_local_cpu_build_for_make_setup():
    constraints = (PROJECT / "constraints.txt").read_text().splitlines()
    assert "torch==2.13.0" in constraints
    assert '"torch>=2.6",' in (PROJECT / "pyproject.toml").read_text()
    pinned = [line for line in constraints if line and not line.startswith("#")]
    assert all("==" in line for line in pinned), "every constraint is an exact pin"


def test_ci_runs_the_readme_test_command_and_the_matrix():
    readme = (PROJECT / "README.md").read_text()
    assert "make test" in readme and "make demo" in readme
    ci = (PROJECT / ".ci" / "run").read_text()
    assert re.search(r"^make test\nmake test-matrix$", ci, re.M) and "set -euo pipefail" in ci


# Collects the whole suite in a fresh pytest and prints, per test, its id, its function and whether it is the matrix's
COLLECT_TIERS = """
import json, pytest
class Tiers:
    def pytest_collection_finish(self, session):
        print(json.dumps([[i.nodeid, i.nodeid.split("[")[0], i.get_closest_marker("matrix") is not None]
                          for i in session.items]))
pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"], plugins=[Tiers()])
"""


def test_make_test_keeps_a_configuration_of_every_parametrized_test_and_the_matrix_holds_only_end_to_end_ones():
    """`make test` leaves the marker `matrix` out: a parametrized test may leave some of its configurations to the
    matrix (CI runs them), never all of them."""
    proc = subprocess.run([sys.executable, "-c", COLLECT_TIERS], capture_output=True, text=True, cwd=PROJECT,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    items = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("[[")))
    matrix = [nodeid for nodeid, _, in_matrix in items if in_matrix]
    assert matrix and all(nodeid.startswith("tests/e2e/") for nodeid in matrix), matrix
    kept = {function for nodeid, function, in_matrix in items if not in_matrix}
    parametrized_away = sorted({function for nodeid, function, in_matrix in items
                                if in_matrix and nodeid != function and function not in kept})
    assert parametrized_away == [], "every configuration of these is in the matrix: keep one in make test"


def test_the_azure_ml_upload_ignores_everything_git_ignores():
    """Azure ML reads .amlignore instead of .gitignore: a venv or runs/ missing from it would be uploaded."""
    def patterns(name):
        return {line.strip() for line in (PROJECT / name).read_text().splitlines()
                if line.strip() and not line.startswith("#")}

    assert patterns(".gitignore") <= patterns(".amlignore")
    assert ".git/" in patterns(".amlignore")


def test_every_declared_package_is_locked():
    locked = drift.locked_versions(PROJECT / "constraints.txt")
    assert [name for name in drift.declared_packages(PROJECT / "environment.yml") if name not in locked] == []
    _, optional = _requirements()
    workstation = [drift._requirement_name(req) for extra in ("notebook", "test") for req in optional[extra]]
    assert [name for name in workstation if name not in locked] == []


@pytest.mark.slow
def test_a_wheel_carries_the_built_in_configs_and_the_cli(tmp_path):
    """`pip install .` (not editable) gets the package from the wheel alone: configs/ outside it would be lost."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
                    str(PROJECT)], check=True, capture_output=True, timeout=300, cwd=tmp_path)
    (wheel,) = tmp_path.glob("trainbook-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist")]
    builtin = {f"toolkit/configs/{name}.yaml" for name in config.builtin_config_names()}
    assert {"toolkit/configs/tiny.yaml", "toolkit/configs/demo.yaml"} <= builtin <= names
    assert "toolkit/cli/main.py" in names and "toolkit/extras.py" in names and "widgets/training.py" in names
    assert not [n for n in names if n.startswith(("tests/", "notebooks/", "bench/"))]
    assert re.search(r"^trainbook = toolkit\.cli:main$", scripts, re.M)
    core = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("Requires-Dist: torch>=2.6") for r in core)
    assert not [r for r in core if re.search(r": (pytest|playwright|jupyterlab|azure-ai-ml|onnxruntime)\b", r)]

    # Installed from the wheel alone (no checkout around it), names resolve inside the package and runs go to the
    # current folder, not into site-packages.
    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    elsewhere.mkdir()
    probe = ("import toolkit, toolkit.config as c, toolkit.paths as p, toolkit.resources.drift as d; "
             "print(toolkit.__file__, c.resolve_config_path('tiny'), p.runs_root(), p.in_checkout(), "
             "' '.join(s.name for s in d.check_installed()), sep='\\n')")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=60,
                         cwd=elsewhere, env={**{k: v for k, v in os.environ.items() if k != "TRAINBOOK_RUNS"},
                              "PYTHONPATH": str(site)}).stdout
    package, tiny, runs, in_checkout, doctor_packages = out.splitlines()
    assert package == str(site / "toolkit" / "__init__.py")
    assert tiny == str(site / "toolkit" / "configs" / "tiny.yaml")
    assert runs == str(elsewhere / "runs")
    # The doctor's packages check has no environment.yml here: it checks the wheel's own core requirements.
    assert in_checkout == "False"
    assert doctor_packages.split() == [drift._requirement_name(req) for req in _requirements()[0]]


@pytest.mark.skipif(importlib.util.find_spec("mlflow") is None, reason="the 'tracking' extra is not installed")
def test_the_tracking_extra_costs_a_deepspeed_process_nothing():
    """DeepSpeed's autotuner imports mlflow when `import deepspeed` runs, if it is installed (the tracking extra puts
    it there): seconds of start-up and ~150 MiB in every rank that never logs to MLflow (the follower process does).
    Our one way in, import_deepspeed(), keeps it out, and leaves mlflow importable afterwards."""
    probe = ("import sys\n"
             "from toolkit.third_party import import_deepspeed\n"
             "import_deepspeed()\n"
             "assert 'deepspeed' in sys.modules\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlflow', 'pandas', 'sqlalchemy')))\n"
             "import mlflow\n"
             "print(mlflow.__name__)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["[]", "mlflow"], proc.stdout


def test_importing_toolkit_changes_nothing_in_the_environment():
    """`import toolkit` in a notebook kernel or a script leaves os.environ as it was (issue 31): what DeepSpeed needs
    is set where DeepSpeed is imported (toolkit.third_party.import_deepspeed)."""
    import subprocess
    import sys

    probe = ("import os; before = dict(os.environ); import toolkit; "
             "print(sorted(set(os.environ.items()) ^ set(before.items())))")
    env = {k: v for k, v in __import__("os").environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == "[]", done.stdout
