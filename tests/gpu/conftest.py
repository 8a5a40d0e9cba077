"""The GPU tier: every test here carries the ``gpu`` marker and needs a CUDA device. Without one (this 2-core
machine, CI) the whole folder is skipped in one line of pytest's summary, never failed; the DeepSpeed tests also skip
with a line of their own when DeepSpeed does not import. On a GPU machine bench/gpu_check.sh runs it, in one process
(``-p no:xdist``: its runs share the one GPU, and its timings mean something only alone):

    python -m pytest tests/gpu -p no:xdist -ra

Figures worth keeping (MFU, tokens/s, checkpoint blocking, memory ratios, the CPU Adam build) go to the JUnit XML as
properties (``--junitxml``), to $TRAINBOOK_FIGURES when that is set (toolkit.report.figures), and to each test's
captured output.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NO_CUDA = "no CUDA device: the GPU tier runs on a machine with one (bench/gpu_check.sh)"
NO_DEEPSPEED = "DeepSpeed does not import here"


def _root_conftest():
    """tests/conftest.py as a module of its own name. Every conftest.py outside a package is imported as module
    ``conftest``, the newest replacing the last in sys.modules: once this one is loaded, ``from conftest import cli``
    (in a test here, or in an e2e module collected after this folder) finds this module, so it re-exports the root's
    helpers below. The root's fixtures and hooks stay registered from the root's own module."""
    name = "_trainbook_tests_root_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "conftest.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_root = _root_conftest()
PROJECT = _root.PROJECT
BIGRAM_MODEL = _root.BIGRAM_MODEL
cli = _root.cli
no_runaway_training = _root.no_runaway_training
assert_server_dies_with_its_starter = _root.assert_server_dies_with_its_starter


def __getattr__(name: str):
    """Every other helper and constant of the root's (``from conftest import TEN_STEPS`` in an e2e module, or in a
    child it spawns, that finds this module first). Not its hooks: pytest registers those from the root itself."""
    if name.startswith(("_", "pytest")):
        raise AttributeError(name)
    return getattr(_root, name)


def pytest_collection_modifyitems(config, items):
    """Mark this folder's tests ``gpu`` (``-m "not gpu"`` leaves them out; ``-m gpu`` runs only them)."""
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.gpu)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test skipped for want of CUDA (or of DeepSpeed) is reported from this file, not from its own line, so that
    pytest's summary (``-ra``) folds the whole folder's skips into one line per reason instead of one per test."""
    report = yield
    if report.skipped and isinstance(report.longrepr, tuple) and \
            any(reason in str(report.longrepr[2]) for reason in (NO_CUDA, NO_DEEPSPEED)):
        report.longrepr = (str(Path(__file__)), None, report.longrepr[2])
    return report


@pytest.fixture(scope="session", autouse=True)
def cuda_name() -> str:
    """The GPU's name as torch reports it (e.g. 'NVIDIA H100 80GB HBM3'). Session-scoped and autouse, so it comes
    before any other fixture of a test here; without CUDA every test skips from this one line, which pytest's
    summary then folds into one."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip(NO_CUDA)
    return torch.cuda.get_device_name(0)


@pytest.fixture(scope="session")
def deepspeed_version(cuda_name) -> str:
    """DeepSpeed's version; the test skips with the reason when DeepSpeed does not import here."""
    try:
        from toolkit.third_party import import_deepspeed

        return import_deepspeed().__version__
    except Exception as exc:  # not installed, or a dependency of it missing: either way nothing to test with
        pytest.skip(f"{NO_DEEPSPEED} ({type(exc).__name__}: {str(exc)[:120]}); bench/gpu_check.sh installs its "
                    "wheel")


@pytest.fixture
def figure(record_property, request):
    """``figure(name, value)``: keep a measured figure (JUnit property, $TRAINBOOK_FIGURES as ``gpu.NAME``, and the
    test's captured output) rather than gate the test on it."""
    from toolkit.report import figures

    def keep(name: str, value) -> None:
        record_property(name, value)
        figures.record(**{f"gpu.{name}": value})
        print(f"{request.node.name}: {name} = {value}")

    return keep


@pytest.fixture(scope="session")
def gpu_runs(cuda_name, tmp_path_factory):
    """``gpu_runs(*args)``: the finished run of ``trainbook train ARGS`` (config first), trained once per session on
    first use and shared by every test that asks for the same arguments: read it, never change it. A run that failed
    fails each test that asks for it, with the tail of its train.log."""
    from gpu_helpers import train

    root = tmp_path_factory.mktemp("gpu-runs")
    done: dict[tuple, object] = {}

    def get(*args: str):
        if args not in done:
            done[args] = train(root / f"run{len(done)}", *args)
        proc, run = done[args]
        assert proc.returncode == 0, f"trainbook train {' '.join(args)} failed:\n{proc.stderr[-2000:]}"
        return run

    return get
