"""Every CLI call builds the whole parser, and `trainbook train` checks its config before it starts anything: neither
may import torch (about a second of CPU per call, paid by every listing, every --help and every launch; the
training processes import it themselves), nor numpy (a tenth of a second more)."""

from __future__ import annotations

import subprocess
import sys

from conftest import PROJECT

HEAVY = ("torch", "deepspeed", "transformers", "numpy")


def modules_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter has imported once ``code`` has run."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=PROJECT, check=True)
    return set(out.stdout.split())


def test_building_the_parser_imports_no_torch():
    assert modules_after("from toolkit.cli.main import build_parser\nbuild_parser()") == set()


def test_loading_and_checking_a_training_config_imports_no_torch():
    code = ("from toolkit import config\nfrom toolkit.train.engines import check_engine\n"
            "check_engine(config.load('tiny', ['engine.nproc=2']), 2)")
    assert modules_after(code) == set()


def test_starting_a_run_imports_neither_torch_nor_numpy():
    """`trainbook train` and every supervisor load the launch path, the checkpoint store included (it verifies
    checkpoints before a restart); only the ranks need the arrays."""
    assert modules_after("import toolkit.runs.launch, toolkit.runs.supervisor") == set()
