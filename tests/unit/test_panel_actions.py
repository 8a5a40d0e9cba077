"""The one rule every panel's buttons follow (widgets.panel): results beside the button, each replacing the last,
double clicks dropped, destructive actions asked first, the form's labels in messages."""

from __future__ import annotations

import threading

import ipywidgets as w

import widgets.panel as panel_mod
from widgets.panel import Confirm, Panel


class Counter(Panel):
    field_labels = {"--size": "VM size"}

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.size = w.Text(value="small")
        self.go = self.button("Go", self.act)
        self.view = w.VBox([self.go, self.outcome_of(self.go).view])

    def act(self) -> None:
        self.calls += 1
        if self.size.value != "small":
            raise ValueError(f"--size: {self.size.value!r} is not a known VM size; allowed: small")
        self.outcome_of(self.go).say(f"done {self.calls}")

    def static_html(self) -> str:
        return self.outcome_of(self.go).value


def test_an_error_shows_beside_its_button_under_the_forms_label_and_the_next_result_replaces_it():
    panel = Counter()
    panel.size.value = "huge"
    panel.go.click()
    said = panel.outcome_of(panel.go).value
    assert "VM size: &#x27;huge&#x27; is not a known VM size" in said and "--size" not in said
    assert panel.message.value == "", "not on a line shared with other controls"
    panel.size.value = "small"
    panel.go.click()
    assert panel.outcome_of(panel.go).value == "done 2"


def test_a_click_on_a_disabled_button_runs_nothing():
    panel = Counter()
    panel.allow(panel.go, "wait for the export")
    assert panel.go.disabled and panel.go.tooltip == "wait for the export"
    panel.go.click()  # a double click's second half, sent before the front end greyed the button out
    assert panel.calls == 0
    panel.allow(panel.go)
    assert not panel.go.disabled and panel.go.tooltip == ""
    panel.go.click()
    assert panel.calls == 1


def test_a_destructive_button_asks_and_only_yes_acts_once():
    panel = Panel()
    done = []
    confirm = Confirm(lambda: "Archive notes:2?", yes="Yes, archive")
    button = panel.button("Archive", lambda: done.append(1), confirm=confirm)
    button.click()
    assert confirm.open and "Archive notes:2?" in confirm.text.value and done == []
    confirm.cancel.click()
    assert not confirm.open and done == []
    button.click()
    confirm.yes.click()
    confirm.yes.click()  # the question closed with the first: nothing more is done
    assert done == [1] and not confirm.open


def test_slow_work_says_what_it_does_with_its_seconds_and_its_button_takes_no_second_click(monkeypatch):
    monkeypatch.setattr(panel_mod, "SHOW_ELAPSED_AFTER_S", 0.0)
    monkeypatch.setattr(panel_mod, "ELAPSED_EVERY_S", 0.05)
    panel = Panel()
    release, ticked, runs = threading.Event(), threading.Event(), []
    button = panel.button("Measure", lambda: panel.in_background("measuring", work, [button], line))
    line = panel.outcome_of(button)

    def work():
        runs.append(1)
        release.wait(30)
        line.say("measured")

    line.doing.observe(lambda change: ticked.set() if change["new"].endswith(" s</i>") else None, names="value")
    button.click()
    assert "measuring…" in line.doing.value and button.disabled
    button.click()  # the double click: dropped
    assert ticked.wait(30), "the seconds never showed"
    release.set()
    panel.wait()
    assert runs == [1] and line.value == "measured" and not button.disabled
