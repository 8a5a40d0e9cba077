"""The model every endpoint test serves: the built-in tiny config trained briefly (the suite's shared run of
SERVED_FLAGS, which test_run_life and the deployment panel read too) and exported once per test session beside it
(the tests that start endpoints share it instead of training one each)."""

from __future__ import annotations

import fcntl
from pathlib import Path

from toolkit.deploy.export import export_run
from toolkit.catalogue.model_format import MANIFEST

SERVED_FLAGS = ("--set", "train.max_steps=30")


def exported_tiny_model(finished_runs) -> Path:
    """The export of ``finished_runs(*SERVED_FLAGS)``, made by the first test that asks, in any xdist worker."""
    run = finished_runs(*SERVED_FLAGS)
    model = run.path.with_name(run.path.name + ".served-model")
    with open(model.with_name(model.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (model / MANIFEST).is_file():
            export_run(run.path, out=model)
    return model
