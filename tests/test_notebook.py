"""The guided training notebook, executed headlessly by papermill, then checked by nbval (--nbval-lax)."""

from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest

from toolkit.demo import NOTEBOOKS, execute, guided_notebooks

pytestmark = pytest.mark.slow


def test_committed_notebooks_have_no_outputs_and_a_parameters_cell():
    for path in guided_notebooks():
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name} has outputs"
        assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1, path.name


def test_training_notebook_runs_headless_and_keeps_its_results(tmp_path):
    runs = tmp_path / "runs"
    executed = execute(NOTEBOOKS / "03_training.ipynb", tmp_path,
                       {"config": "tiny", "runs_root": str(runs),
                        "overrides": ["profile.enabled=true", "profile.wait=1", "profile.warmup=1"]})
    nb = nbformat.read(executed, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    # The live card was updated in place through display_id: the stored copy shows the finished run.
    assert any("completed" in h and "40 / 40" in h for h in html), html
    assert any("image/png" in o.get("data", {}) for o in outputs), "loss curve picture missing"
    text = "".join(o.get("text", "") for o in outputs)
    assert "bits per byte" in text and "aten::" in text, text
    (run_dir,) = runs.iterdir()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"

    # nbval re-executes the executed copy (parameters included) and compares the checked cells' outputs.
    proc = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", str(executed), "-q", "-p",
                           "no:cacheprovider", "-o", "addopts="], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout
