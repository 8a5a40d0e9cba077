"""Strings two processes must agree on (environment variables, a module path run with -m) are spelled once: one
module owns each as a named constant, and the other side imports it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]

OWNERS = {
    "TRAINBOOK_KEY_FILE": "toolkit/deploy/serving/options.py",  # endpoint.py sets it, score.py reads it
    "TRAINBOOK_ATTEMPT": "toolkit/status.py",  # the supervisor sets it, the trainer reads it
    "toolkit.runs.supervisor": "toolkit/runs/processes.py",  # launch.py runs it, processes.py recognises it
}


@pytest.mark.parametrize("literal", OWNERS)
def test_each_contract_string_is_written_in_its_owner_only(literal):
    holders = [str(path.relative_to(PROJECT)) for path in sorted((PROJECT / "toolkit").rglob("*.py"))
               if f'"{literal}"' in path.read_text() or f"'{literal}'" in path.read_text()]
    assert holders == [OWNERS[literal]], holders


def test_the_supervisor_module_path_names_the_supervisor():
    from toolkit.runs.processes import SUPERVISOR_MODULE

    spec = importlib.util.find_spec(SUPERVISOR_MODULE)
    assert spec is not None and spec.origin == str(PROJECT / "toolkit" / "runs" / "supervisor.py"), spec
