"""Panels driven as a person would drive them (set the form, click the buttons), against real runs."""

from __future__ import annotations

import urllib.request

import pytest
from conftest import BIGRAM_MODEL

from toolkit.rundir import RunDir
from widgets.training import TrainingPanel


@pytest.fixture
def panel(tmp_path):
    # Every step after the first checkpoint sleeps 15 ms (sleeps change no loss): 400 tiny steps would otherwise end
    # in ~3 s, and the kill clicked once step 60 shows could come after the end on a busy machine.
    panel = TrainingPanel(config="tiny", steps=400, checkpoint_every=20, profile=False, runs_root=tmp_path,
                          plot_every_s=0.5, overrides=["fault.slow_steps_after_checkpoint=20",
                                                       "fault.slow_step_ms=15"])
    panel.show()
    yield panel
    panel.stop()
    panel.close()


def test_start_kill_and_resume_from_the_buttons(panel):
    panel.buttons["Start"].click()
    assert panel.actions.value == "" and panel.handle is not None
    assert panel.buttons["Start"].disabled and not panel.buttons["Kill"].disabled
    assert panel.wait_until(lambda p: p.step >= 60)
    panel.buttons["Kill"].click()  # a lost node
    status = panel.wait()
    assert status["state"] == "killed" and not panel.buttons["Resume"].disabled
    killed_at = panel._progress.step
    assert killed_at < 400

    panel.buttons["Resume"].click()
    panel.buttons["Resume"].click()  # a double click: dropped, where it once blocked the kernel for the whole run
    assert panel.buttons["Resume"].disabled and panel.buttons["Resume"].tooltip == "the run is training"
    assert panel.wait_until(lambda p: p.state == "running" and p.step > killed_at)
    assert "signal SIGKILL" in panel.card.value and "#d62728" not in panel.card.value, "the kill is history now"
    status = panel.wait()
    assert status["state"] == "completed" and status["step"] == 400
    assert panel.actions.value == "", panel.actions.value
    assert panel.buttons["Resume"].disabled and "nothing left to train" in panel.buttons["Resume"].tooltip
    assert panel.progress.value == 1.0 and panel.progress.description == "100%"
    assert "completed" in panel.card.value and "400 / 400" in panel.card.value
    assert panel.plot.value[:8] == b"\x89PNG\r\n\x1a\n", "the loss curve is drawn"
    static = panel.static_html()
    assert "data:image/png;base64," in static and "400 / 400" in static, "the static twin shows the same"
    assert RunDir(panel.run.path).events("checkpoint"), "checkpoint markers come from checkpoint events"


def test_a_past_run_opens_with_the_same_dashboard_and_the_tensorboard_button_serves_it(panel, tmp_path):
    panel.steps.value = 40
    panel.start()
    panel.wait()
    live_card = panel.card.value.split("elapsed")[0]
    other = TrainingPanel(config="tiny").open_run(panel.run.path)
    assert other.card.value.split("elapsed")[0] == live_card
    assert other.progress.value == 1.0 and other.plot.value[:4] == b"\x89PNG"

    panel.buttons["TensorBoard"].click()
    assert "http://127.0.0.1:" in panel.links.value
    with urllib.request.urlopen(panel.tb_server.url + "data/runs", timeout=30) as response:
        assert response.status == 200


def test_bad_form_input_is_shown_inline_and_starts_nothing(panel, tmp_path):
    panel.steps.value = -5
    panel.buttons["Start"].click()
    assert "steps (train.max_steps): -5" in panel.actions.value, panel.actions.value
    assert panel.handle is None and list(tmp_path.iterdir()) == []
    assert panel.buttons["TensorBoard"].disabled and panel.buttons["TensorBoard"].tooltip == "start or open a run first"
    panel.buttons["TensorBoard"].click()  # greyed out in a browser; a click that reaches the kernel does nothing
    assert panel.tb_server is None and "steps (train.max_steps): -5" in panel.actions.value


def test_the_form_trains_your_own_model_and_refuses_one_that_is_not(panel, tmp_path):
    source = tmp_path / "my_model.py"
    source.write_text(BIGRAM_MODEL)
    panel.steps.value = 20
    panel.model.value = "not a model"
    panel.buttons["Start"].click()
    assert "model: &#x27;not a model&#x27; is neither an import path nor a folder" in panel.actions.value
    assert panel.handle is None

    panel.model.value = f"{source}:build"
    panel.buttons["Start"].click()
    assert panel.actions.value == "", panel.actions.value
    assert panel.wait()["state"] == "completed"
    cfg = panel.run.read_config()
    assert (cfg.model.name, cfg.model.factory) == ("custom", f"{source}:build")


def test_the_form_takes_your_deepspeed_config_and_shows_what_deepspeed_got(tmp_path):
    """A DeepSpeed file, accumulation and precision from the form: the run trains with the file's stage, the panel
    shows the merged deepspeed_config.json and each rank's peak memory; a file DeepSpeed would not read is refused
    inline, naming the key, with nothing started."""
    import json

    from ds_examples import ZERO2_AUTO

    ds = tmp_path / "my ds #2.json"  # a '#' would end the value in a section.field=value string left unquoted
    ds.write_text(json.dumps(ZERO2_AUTO))
    panel = TrainingPanel(config="tiny", engine="deepspeed", nproc=2, steps=10, profile=False,
                          runs_root=tmp_path / "runs", deepspeed_config=str(ds), grad_accum_steps=2,
                          precision="bf16")
    panel.show()
    try:
        panel.buttons["Start"].click()
        assert panel.actions.value == "", panel.actions.value
        assert panel.wait()["state"] == "completed"
        config = panel.run.read_config()
        assert (config.engine.zero_stage, config.train.grad_accum_steps, config.engine.precision) == (2, 2, "bf16")
        assert "DeepSpeed config this run got" in panel.deepspeed_view.value
        assert "&quot;stage&quot;: 2" in panel.deepspeed_view.value and "deepspeed_config.json" in panel.static_html()
        assert "peak memory / rank" in panel.card.value and panel.card.value.count(" · ") >= 1
        ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_com": True}}))
        before = sorted((tmp_path / "runs").iterdir())
        panel.buttons["Start"].click()
        assert "zero_optimization.overlap_com" in panel.actions.value
        assert sorted((tmp_path / "runs").iterdir()) == before
    finally:
        panel.close()
