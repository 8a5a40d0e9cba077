"""Workshop mode: N parameter sets through the same notebook with papermill, in parallel, and one report."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import cli


def _params(tmp_path, sets) -> str:
    path = tmp_path / "workshop.yaml"
    path.write_text(yaml.safe_dump(sets))
    return str(path)


@pytest.mark.slow
def test_two_participants_run_in_parallel_and_are_compared(tmp_path):
    sets = [{"config": "tiny", "steps": 30, "overrides": ["train.seed=1"]},
            {"config": "tiny", "steps": 30, "overrides": ["train.seed=2", "optim.lr=0.01"]}]
    out = tmp_path / "report"
    proc = cli("workshop", "run", "--participants", "2", "--params", _params(tmp_path, sets), "--out", str(out),
               timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split()[:2] for line in (out / "report.md").read_text().splitlines() if line.startswith(("1 ", "2 "))]
    assert rows == [["1", "ok"], ["2", "ok"]], rows
    assert (out / "report.png").read_bytes()[:4] == b"\x89PNG"
    report = json.loads((out / "report.json").read_text())
    assert [r["status"] for r in report] == ["ok", "ok"]
    for i, r in enumerate(report, start=1):
        folder = out / f"participant-{i:02d}"
        assert (folder / "03_training.ipynb").exists() and len(r["runs"]) == 1
        assert r["runs"][0]["steps"] == 30 and r["runs"][0]["state"] == "completed"
        # each participant trained with its own seed, on its share of the cores
        config = yaml.safe_load(next((folder / "runs").iterdir()).joinpath("config.yaml").read_text())
        assert config["train"]["seed"] == i and config["train"]["threads"] == 1
    losses = [r["runs"][0]["val_bpb"] for r in report]
    assert losses[0] != losses[1], "different parameter sets, different results"


@pytest.mark.parametrize("content, args, message", [
    (None, ["--participants", "1"], "--params: "),
    ("just a string", ["--participants", "1"], "holds a str; allowed: a YAML list of mappings"),
    ([{"config": "tiny"}], ["--participants", "3"], "--participants: 3 is more than the 1 parameter sets"),
    ([{"config": "tiny"}], ["--participants", "0"], "--participants: 0 is not allowed"),
    ([{"config": "tiny", "learning_rate": 1}], ["--participants", "1"],
     "participant 1: 'learning_rate' is not a parameter of 03_training.ipynb"),
    ([{"config": "tiny"}], ["--participants", "1", "--notebook", "99_nothing"], "--notebook: '99_nothing' matches no"),
    ([{"config": "tiny"}, {"config": "tiny", "overrides": ["optim.lr=-1"]}], ["--participants", "2"],
     "participant 2: optim.lr: -1"),
    ([{"config": "tiny", "steps": 0}], ["--participants", "1"], "participant 1: train.max_steps: 0"),
    ([{"config": "nope"}], ["--participants", "1"], "participant 1: config: 'nope' is neither a file"),
])
def test_bad_workshop_input_is_refused_before_anything_runs(tmp_path, content, args, message):
    params = str(tmp_path / "missing.yaml") if content is None else _params(tmp_path, content)
    out = tmp_path / "report"
    proc = cli("workshop", "run", "--params", params, "--out", str(out), *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists()
