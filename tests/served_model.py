"""The model every endpoint test serves: the built-in tiny config trained briefly and exported, once per test session
(the tests that start endpoints share it instead of training one each)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from toolkit.deploy.export import export_run
from toolkit.catalogue.model_format import MANIFEST

PROJECT = Path(__file__).resolve().parent.parent


def exported_tiny_model(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.getbasetemp() / "served-tiny" / "run"
    model = run_dir / "model"
    if not (model / MANIFEST).is_file():
        run_dir.parent.mkdir(exist_ok=True)
        proc = subprocess.run([sys.executable, "-m", "toolkit", "train", "tiny", "--run-dir", str(run_dir), "--set",
                               "train.max_steps=30"], capture_output=True, text=True, cwd=PROJECT, timeout=300,
                              env={**os.environ, "TRAINBOOK_WORKSPACE": str(run_dir.parent / "workspace")})
        assert proc.returncode == 0, proc.stderr
        model = export_run(run_dir).path
    return model
