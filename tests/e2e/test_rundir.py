"""The run-directory primitives every reader depends on: atomic status, tolerant event tailing."""

from __future__ import annotations

import json

import pytest

from toolkit import config as config_mod
from toolkit.events import EventLog, TrainEvent
from toolkit.rundir import RunDir


def test_create_writes_config_and_queued_status(tmp_path):
    cfg = config_mod.load("tiny")
    run = RunDir.create(tmp_path / "r", cfg)
    assert run.read_config() == cfg
    assert run.read_status()["state"] == "queued"
    with pytest.raises(FileExistsError, match="already holds a run"):
        RunDir.create(tmp_path / "r", cfg)


def test_status_rejects_unknown_states_and_leaves_the_file_intact(tmp_path):
    run = RunDir.create(tmp_path / "r", config_mod.load("tiny"))
    before = run.status_path.read_text()
    with pytest.raises(ValueError, match="status.state: 'exploded' is not allowed; allowed: queued, running"):
        run.write_status(state="exploded")
    assert run.status_path.read_text() == before
    assert [p.name for p in run.path.iterdir() if p.name.endswith(".tmp")] == []


def test_reader_waits_for_a_line_to_be_complete(tmp_path):
    run = RunDir.create(tmp_path / "r", config_mod.load("tiny"))
    log = EventLog(run.events_path)
    log.write(TrainEvent(step=1, loss=5.0, lr=1e-3, tokens_per_s=1.0, data_wait_pct=0.0, mfu=0.0, elapsed_s=0.1))
    with open(run.events_path, "a") as f:  # a writer caught mid-line
        f.write('{"event": "train", "st')
    events, offset = run.read_events()
    assert [e["step"] for e in events] == [1]
    with open(run.events_path, "a") as f:
        f.write('ep": 2}\n')
    more, _ = run.read_events(offset)
    assert more == [{"event": "train", "step": 2}]
    log.close()
    assert json.loads(run.events_path.read_text().splitlines()[0])["loss"] == 5.0
