"""The run's state machine (toolkit.status): the transition table, and that status.json is changed only
through it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from toolkit import config as config_mod
from toolkit import status
from toolkit.rundir import RunDir
from toolkit.status import IllegalTransition, next_state

PROJECT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("current, name, expected", [
    (None, "create", "queued"),
    ("queued", "start", "running"),
    ("running", "start", "running"),  # a restarted attempt reports again
    ("running", "complete", "completed"),
    ("running", "fail", "failed"),
    ("running", "kill", "killed"),
    ("queued", "fail", "failed"),  # died while building
    ("queued", "kill", "killed"),
    ("running", "stop", "stopped"),  # stopped on request (Ctrl-C, SIGTERM, stop()): not a death
    ("queued", "stop", "stopped"),
    ("completed", "stop", "stopped"),  # reported completion, then stopped in teardown
    ("stopped", "resume", "queued"),
    ("stopped", "roll_back", "queued"),
    ("completed", "fail", "failed"),  # reported completion, then died in teardown
    ("failed", "restart", "running"),
    ("running", "restart", "running"),
    ("failed", "resume", "queued"),
    ("killed", "resume", "queued"),
    ("running", "resume", "queued"),  # left behind by a dead supervisor (launch checks it is dead)
    ("completed", "roll_back", "queued"),
    ("completed", "retry", "queued"),
])
def test_allowed_transitions(current, name, expected):
    assert next_state(current, name) == expected


@pytest.mark.parametrize("current, name", [
    ("completed", "resume"),  # nothing left to train: resume is a no-op, only a roll-back restarts it
    ("completed", "start"),
    ("completed", "restart"),
    ("killed", "start"),
    ("failed", "complete"),
    ("queued", "complete"),  # completion is reported by a run that ran
    ("killed", "kill"),
    ("stopped", "start"),
    ("stopped", "stop"),
    ("stopped", "kill"),  # a stopped run has no processes left for a lost node to take down
    ("killed", "stop"),
    ("failed", "fail"),
    ("queued", "create"),
    (None, "start"),
])
def test_illegal_transitions_name_the_transition_the_state_and_what_is_allowed(current, name):
    with pytest.raises(IllegalTransition, match=rf"'{name}': not allowed from state '{current}'; allowed: from "
                       if current else rf"'{name}': not allowed from a new run; allowed: from "):
        next_state(current, name)


def test_every_final_state_is_left_only_towards_queued_or_by_a_death_after_completion():
    for name, (sources, target) in status.TRANSITIONS.items():
        for source in sources:
            if source in ("failed", "stopped", "killed") and target != "queued":
                assert (name, source, target) == ("restart", "failed", "running"), name
            if source == "completed":
                assert target in ("queued", "failed", "stopped", "killed"), name


def test_a_stopped_run_is_final_and_resumable_like_a_killed_one():
    assert "stopped" in status.STATES and "stopped" in status.FINAL_STATES
    assert set(status.RESUMABLE_STATES) == {"failed", "stopped", "killed"}
    assert set(status.FINAL_STATES) == set(status.STATES) - {"queued", "running"}


def test_unknown_transition_and_a_state_passed_in_are_refused():
    with pytest.raises(IllegalTransition, match="'explode' is unknown; allowed: create, start"):
        next_state("running", "explode")


def test_transition_writes_the_state_and_refuses_leaves_the_file_as_it_was(tmp_path):
    run = RunDir.create(tmp_path / "r", config_mod.load("tiny"))
    assert run.read_status()["state"] == "queued" and run.read_status()["restarts"] == 0
    status.transition(run, "start", pid=123)
    status.transition(run, "restart", last_failure="signal SIGKILL")
    status.transition(run, "restart", last_failure="signal SIGKILL")
    assert run.read_status()["restarts"] == 2 and run.read_status()["pid"] == 123
    status.transition(run, "complete", step=40)
    before = run.status_path.read_text()
    with pytest.raises(IllegalTransition, match="'resume': not allowed from state 'completed'"):
        status.transition(run, "resume")
    with pytest.raises(IllegalTransition, match="changed only through transition"):
        status.update(run, state="running")
    with pytest.raises(IllegalTransition, match="set by the transition"):
        status.transition(run, "roll_back", state="running")
    assert run.status_path.read_text() == before
    status.update(run, step=41)
    assert run.read_status()["state"] == "completed" and run.read_status()["step"] == 41


def test_status_json_is_written_only_through_the_status_module():
    """One owner of the run's states: no other module of the toolkit or the widgets writes status.json."""
    writers = [f"{path.relative_to(PROJECT)}:{n}" for folder in ("toolkit", "widgets")
               for path in sorted((PROJECT / folder).rglob("*.py")) if path.name != "status.py"
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r"\.write_status\(|status_path\b.*write", line)]
    assert writers == [], writers



def test_every_state_has_its_own_colour_in_the_run_card():
    from widgets.run_progress import STATE_COLOURS

    assert set(STATE_COLOURS) == set(status.STATES)
    assert STATE_COLOURS["stopped"] != STATE_COLOURS["killed"]
