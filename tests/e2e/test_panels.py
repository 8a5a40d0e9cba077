"""The data, checkpoints, resources and journey panels, driven as a person would (fill the form, click), for real:
a real workspace catalogue (SQLite), real training runs, real checkpoints on disk."""

from __future__ import annotations

import json

import pytest
from conftest import BIGRAM_MODEL, NO_CHECKPOINT
from test_checkpoint import CKPT

from toolkit import config as config_mod
from toolkit.catalogue import data_assets
from toolkit.runs import launch
from toolkit.data.builtin import register_pydoc
from toolkit.data.tokenizer_training import train_tokenizer
from toolkit.checkpoint.store import CheckpointStore
from toolkit.config import ConfigError
from toolkit.deploy.export import export_run
from toolkit.deploy.serving.endpoint import serve
from toolkit.catalogue.model_registry import register_model
from toolkit.rundir import RunDir
from widgets.checkpoints import CheckpointsPanel
from widgets.data import DataPanel, path_suggestions
from widgets.journey import STEPS, JourneyPanel
from widgets.resources import AzureStatusPanel, ForecastPanel, MemoryPanel

# --- data --------------------------------------------------------------------------------------------------------


@pytest.fixture
def data_panel(tmp_path):
    return DataPanel(workspace=tmp_path / "ws", config="tiny", tune_steps=3).show()


def test_the_form_names_each_bad_field_before_anything_is_written(data_panel, tmp_path):
    panel = data_panel
    assert panel.register_button.disabled and "fill in: name, path" in panel.problems.value
    folder = tmp_path / "corpus"
    folder.mkdir()
    panel.name.value, panel.path.value, panel.type.value = "bad name!", str(tmp_path / "missing.txt"), "uri_file"
    assert "name: &#x27;bad name!&#x27; is not allowed" in panel.problems.value
    assert "does not exist" in panel.problems.value and panel.register_button.disabled
    panel.name.value, panel.path.value = "corpus", str(folder)  # a folder where a file is expected
    assert "is not a file; allowed: a single file (type uri_file)" in panel.problems.value
    panel.type.value = "uri_folder"  # an empty folder passes the form; register refuses it, inline
    assert panel.problems.value == "" and not panel.register_button.disabled
    panel.register_button.click()
    panel.wait()
    assert "is an empty folder" in panel.outcome_of(panel.register_button).value
    assert data_assets.list_assets(panel.ws) == [], "nothing registered"


def test_register_versions_archive_and_clear_the_form_from_the_buttons(data_panel, tmp_path):
    panel = data_panel
    notes = tmp_path / "notes.txt"
    notes.write_text("version one")
    panel.name.value, panel.type.value, panel.path.value = "notes", "uri_file", str(notes)
    panel.description.value = "a scratch file"
    registered = panel.outcome_of(panel.register_button)
    panel.register_button.click()
    panel.register_button.click()  # a double click: the second reaches a disabled button and is dropped
    assert panel.wait().ref == "notes:1" and "registered notes:1" in registered.value
    assert "busy" not in registered.value and "unchanged" not in registered.value
    panel.register_button.click()
    assert panel.wait().ref == "notes:1" and "unchanged content, already notes:1" in registered.value
    assert "registered notes:1" not in registered.value, "each result replaces the last"
    notes.write_text("version two")
    panel.register_button.click()
    assert panel.wait().ref == "notes:2"
    assert "notes:1" in panel.versions.value and "notes:2" in panel.versions.value
    assert data_assets.get(panel.ws, "notes:1").path.read_text() == "version one"

    panel.archive_choice.value = "notes:2"
    panel.archive_button.click()  # asks first: nothing is archived yet
    assert panel.archive_confirm.open and "Archive notes:2?" in panel.archive_confirm.text.value
    assert data_assets.get(panel.ws, "notes").ref == "notes:2"
    panel.archive_confirm.cancel.click()
    assert not panel.archive_confirm.open and data_assets.get(panel.ws, "notes").ref == "notes:2"
    panel.archive_button.click()
    panel.archive_confirm.yes.click()
    panel.archive_confirm.yes.click()  # a double click on Yes: the question is closed, nothing more is done
    assert data_assets.get(panel.ws, "notes").ref == "notes:1", "latest skips the archived version"
    assert "archived notes:2" in panel.outcome_of(panel.archive_button).value
    assert "notes:2" not in panel.versions.value
    panel.show_archived.value = True
    assert "notes:2" in panel.versions.value
    assert "notes:1" in panel.static_html(), "the static twin shows the catalogue"

    # what a scripted demo leaves (a bad name shown) is gone after clear_form: a person's own registration
    # inherits no value of it, and the catalogue keeps what was registered
    panel.name.value = "bad name!"
    assert "is not allowed" in panel.problems.value
    panel.clear_form()
    assert (panel.name.value, panel.path.value, panel.description.value, panel.type.value) == ("", "", "", "uri_folder")
    assert panel.outcome_of(panel.register_button).value == "" and "is not allowed" not in panel.problems.value
    assert "fill in: name, path" in panel.problems.value and panel.register_button.disabled
    assert "notes:1" in panel.static_html()


def test_the_path_box_suggests_the_folder_being_typed(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / ".hidden").write_text("x")
    assert path_suggestions(f"{tmp_path}/") == [f"{tmp_path}/sub/", f"{tmp_path}/a.txt"]
    assert path_suggestions(f"{tmp_path}/a") == [f"{tmp_path}/sub/", f"{tmp_path}/a.txt"]
    assert path_suggestions(f"{tmp_path}/nowhere/x") == []


def test_the_loading_advisor_measures_the_chosen_asset(data_panel):
    panel = data_panel
    register_pydoc(panel.ws)
    panel.refresh_versions()
    assert panel.advisor_asset.value == "pydoc"
    panel.measure_button.click()
    assert panel.measure_button.disabled, "one measurement at a time"
    report = panel.wait()
    assert report.asset == "pydoc:1" and len(report.trials) == 4
    assert "data loading for pydoc:1" in panel.advice_text.value
    assert panel.advice_plot.value[:4] == b"\x89PNG" and "data:image/png" in panel.static_html()
    assert not panel.measure_button.disabled


def test_a_measurement_that_fails_says_so_beside_its_button_and_takes_the_old_advice_away(data_panel, tmp_path):
    panel = data_panel
    register_pydoc(panel.ws)
    panel.refresh_versions()
    panel.measure_button.click()
    panel.wait()
    assert "data loading for pydoc:1" in panel.advice_text.value
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("too short")  # fewer bytes than one block of the tiny model
    data_assets.register(panel.ws, "notes", tiny, type="uri_file")
    panel.refresh_versions()
    panel.advisor_asset.value = "notes"
    panel.measure_button.click()
    panel.wait()
    measured = panel.outcome_of(panel.measure_button).value
    assert "is too long for the train split of notes:1" in measured, measured
    assert panel.outcome_of(panel.register_button).value == "", "not under another button"
    assert panel.advice_text.value == "" and panel.advice_plot.value == b"", "pydoc's advice is gone"
    assert "data loading for pydoc" not in panel.static_html() and measured in panel.static_html()


# --- checkpoints -------------------------------------------------------------------------------------------------


@pytest.fixture
def finished_run(finished_run_copy) -> RunDir:
    """This test's copy of test_checkpoint's shared run: 40 steps, each logged, checkpoints 20, 30, 40 kept."""
    return finished_run_copy(*CKPT)


def test_checkpoints_panel_lists_verifies_and_rolls_back(finished_run):
    original = {e["step"]: e["loss"] for e in finished_run.events("train")}
    panel = CheckpointsPanel(finished_run.path, gpus=64).show()
    assert [i.name for i in panel.infos] == ["step_00000020", "step_00000030", "step_00000040"]
    assert "step_00000040  &lt;- LATEST" in panel.table.value and panel.resume_from.value == "step_00000040"
    # each row carries what its checkpoint cost, from the run's events: the training time lost, then the blocking
    lost = {e["step"]: e["lost_ms"] for e in finished_run.events("checkpoint")}
    assert "training lost ms" in panel.table.value and "of which blocked" in panel.table.value
    assert f">{lost[30]:,.1f}</td>" in panel.table.value, panel.table.value

    # corrupt one file of step 30: the listing says so, and it is no longer offered
    victim = next(p for p in (finished_run.path / "checkpoints" / "step_00000030").iterdir() if p.suffix == ".pt")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    panel.refresh_button.click()
    panel.wait()
    assert "fails its xxh3_128 check" in panel.table.value
    assert [v for _, v in panel.resume_from.options] == ["step_00000020", "step_00000040"]

    assert panel.resume_button.disabled and "the run is completed: nothing left to train" in panel.resume_hint.value
    panel.resume_from.value = "step_00000020"  # a roll-back: Resume is offered
    assert not panel.resume_button.disabled and panel.resume_hint.value == ""
    panel.resume_button.click()
    panel.resume_button.click()  # a double click: dropped, not a second resume queued behind the first
    assert panel.resume_button.disabled
    status = panel.wait()
    assert status["state"] == "completed" and status["step"] == 40, status
    replayed = {e["step"]: e["loss"] for e in RunDir(finished_run.path).events("train")}
    assert replayed == original, "steps 21..40 replayed from step 20 give the same losses"
    resumed = panel.outcome_of(panel.resume_button).value
    assert "resumed from step_00000020" in resumed and "completed at step 40" in resumed, resumed
    assert "completed" in panel.card.value
    assert len([e for e in RunDir(finished_run.path).events("status") if e.get("resumed_step")]) == 1, "one resume"
    assert panel.resume_button.disabled, "completed again: nothing left to resume"
    assert sum(i.name.startswith("superseded-") for i in panel.infos) == 2, "set aside, never deleted"
    assert "superseded by a roll-back" in panel.static_html()


def test_interval_advisor_follows_the_slider(finished_run):
    panel = CheckpointsPanel(finished_run.path, gpus=8)
    few = panel.advice.interval_s
    panel.gpus.value = 16384
    assert panel.advice.interval_s < few, "more GPUs fail more often: checkpoint more often"
    assert "MTBF" in panel.advice_text.value and panel.advice_plot.value[:4] == b"\x89PNG"
    assert panel.advice.cost_basis == "lost" and "training time lost" in panel.advice_text.value
    panel.restart_s.value = 600
    assert panel.advice.restart_s == 600


def test_checkpoints_panel_refuses_a_folder_without_a_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="run_dir: .* holds no run"):
        CheckpointsPanel(tmp_path)


def test_a_run_without_checkpoints_explains_inline(finished_run_copy):
    run = finished_run_copy(*NO_CHECKPOINT)
    panel = CheckpointsPanel(run.path)
    assert "no checkpoints yet" in panel.table.value and "has no checkpoint events" in panel.message.value
    assert panel.resume_button.disabled and "no valid checkpoint to resume from" in panel.resume_hint.value
    panel.resume_button.click()  # greyed out in a browser; a click that reaches the kernel anyway does nothing
    assert panel.handle is None
    assert CheckpointStore(run.path).list() == []


# --- resources ---------------------------------------------------------------------------------------------------


def test_memory_sliders_update_the_estimate():
    panel = MemoryPanel(model_size="7B", gpus=8, gpu_memory_gib=80).show()
    assert "Recommended: <b>ZeRO-1</b>" in panel.headline.value and "fits" in panel.headline.value
    assert panel.zero_stage.label == "recommended", "the stage the headline follows is the one lit"
    panel.gpus.value = 1
    assert "does not fit" in panel.headline.value and "no stage fits" in panel.headline.value
    panel.model_size.value = "125M"
    assert "Recommended: <b>ZeRO-0</b>" in panel.headline.value
    panel.zero_stage.value = 3
    assert "ZeRO-3 on 1 GPU:" in panel.headline.value
    panel.precision.value = "fp32"
    assert "fp32" in panel.headline.value and panel.plot.value[:4] == b"\x89PNG"
    assert panel.headline.value in panel.static_html()
    with pytest.raises(ConfigError, match="params: 'seven' is not allowed"):
        MemoryPanel(model_size="seven")


def test_the_memory_panel_splits_each_layer_and_says_a_split_the_gpus_do_not_divide():
    panel = MemoryPanel(model_size="175B", gpus=1024, gpu_memory_gib=80, tensor_parallel=8).show()
    assert "each layer split over 8: <b>43.6 GiB</b>" in panel.headline.value  # 2 Ψ/8 + 18 Ψ/8 / 128, ZeRO-2
    assert "Recommended: <b>ZeRO-2</b>" in panel.headline.value and "Ψ/8" in panel.formula.value
    panel.tensor_parallel.value = 1
    assert "Recommended: <b>ZeRO-3</b>" in panel.headline.value and "split over" not in panel.headline.value
    panel.gpus.value = 1
    panel.tensor_parallel.value = 2
    assert "split over: 2 is not allowed; allowed: a divisor of the 1 GPUs" in panel.message.value


def test_the_memory_panel_takes_the_guide_s_175b_layout_in_pipeline_stages():
    # Megatron-DeepSpeed's 175B on 1,024 GPUs: each layer over 8, 16 stages, ZeRO over the 8 replicas left
    panel = MemoryPanel(model_size="175B", gpus=1024, gpu_memory_gib=80, tensor_parallel=8, pipeline_parallel=16)
    panel.show()
    assert "each layer split over 8, in 16 pipeline stages: <b>25.5 GiB</b>" in panel.headline.value  # 20 Ψ/128
    assert "Recommended: <b>ZeRO-0</b>" in panel.headline.value and "Ψ/128" in panel.formula.value
    panel.gpus.value = 8
    assert "stages: 16 is not allowed; allowed: a divisor of the 1 GPUs left by tensor_parallel 8" in panel.message.value


def test_the_forecast_panel_compares_sizes_and_says_a_bad_field_by_its_label():
    panel = ForecastPanel(params="7B", tokens="140B", sizes=("Standard_ND96isr_H100_v5",), nodes="1,4").show()
    assert [row.nodes for row in panel.report.rows] == [1, 4] and panel.plot.value[:4] == b"\x89PNG"
    assert "Standard_ND96isr_H100_v5" in panel.table.value and "tokens: 1.4e+11, given" in panel.sources.value
    panel.sizes.value = ("Standard_ND96isr_H100_v5", "Standard_ND96amsr_A100_v4")
    panel.nodes.value = "2"
    panel.forecast_button.click()
    assert sorted(row.sku for row in panel.report.rows) == ["Standard_ND96amsr_A100_v4", "Standard_ND96isr_H100_v5"]
    panel.nodes.value = "2,zero"
    panel.forecast_button.click()
    assert "nodes: &#x27;zero&#x27; is not allowed" in panel.outcome_of(panel.forecast_button).value
    panel.nodes.value, panel.params.value = "1", "lots"
    panel.forecast_button.click()
    assert "parameters: &#x27;lots&#x27; is not allowed" in panel.outcome_of(panel.forecast_button).value
    assert panel.table.value == "" and "GPU-hours" not in panel.static_html()  # no earlier forecast beside the error


def test_azure_status_names_the_missing_piece(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    panel = AzureStatusPanel().show()
    assert panel.check().connected is False
    assert "OFFLINE" in panel.status_html.value and "config.json" in panel.status_html.value
    (tmp_path / "config.json").write_text("{not json")
    panel.check_button.click()
    assert "is not valid JSON" in panel.status_html.value
    (tmp_path / "config.json").write_text(json.dumps({"subscription_id": "00000000-1111-2222-3333-444444444444",
                                                      "resource_group": "rg", "workspace_name": "ws"}))
    for var in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET"):
        monkeypatch.delenv(var, raising=False)
    status = panel.check()
    assert status.workspace is not None and not status.connected and "credentials" in status.reason
    assert "4444" in panel.status_html.value and "1111-2222" not in panel.status_html.value, "masked"


# --- the journey -------------------------------------------------------------------------------------------------


def test_each_journey_tick_comes_from_its_own_step_and_a_skipped_step_stays_to_do(tmp_path):
    """The steps done out of order, some skipped: another step's traces (built-in corpora registered by 01 and 06,
    04's unprofiled runs, 06's served export) never tick a step that was not done."""
    ws_dir = tmp_path / "ws"
    panel = JourneyPanel(ws_dir).show()
    ticks = lambda: [done for done, _ in panel.refresh()]  # noqa: E731
    assert ticks() == [False] * 6 and "the doctor has not checked it yet" in panel.table.value

    register_pydoc(panel.ws)  # what 01 and 06 do on their way, 06 also training a tokenizer
    train_tokenizer(panel.ws, "pydoc:1", 300, progress=False)
    assert ticks() == [False] * 6, panel.statuses
    assert "none of your own yet; built-in or made here: pydoc-bpe300:1, pydoc:1" in panel.table.value
    notes = tmp_path / "notes.txt"
    notes.write_text("our own text")
    data_assets.register(panel.ws, "notes", notes, type="uri_file")
    assert ticks() == [False, True, False, False, False, False]

    # 04's runs (profiler off): a run killed and resumed, with 03 skipped
    cfg = config_mod.load("tiny", ["train.max_steps=20", "train.max_seconds=0", "checkpoint.every_steps=10",
                                   "profile.enabled=false", f"data.workspace={ws_dir}"])
    handle = launch.start(cfg, runs_root=tmp_path / "runs")
    assert handle.wait(120) == 0
    assert launch.resume(handle.path, from_checkpoint="step_00000010").wait(120) == 0
    assert ticks() == [False, True, False, True, False, False], panel.statuses
    assert "1 completed, 0 of them profiled" in panel.table.value and "1 resumed" in panel.table.value

    # 05: registering is not serving
    model = register_model(panel.ws, export_run(handle.path).path)
    assert model.data == "pydoc:1", "trained on the built-in corpus's source: named by the version with its bytes"
    assert ticks()[4] is False and "tiny:1; none served yet" in panel.table.value
    with serve(model.ref, workspace=ws_dir):
        pass
    assert ticks()[4] is True and f"served: tiny ({model.ref})" in panel.table.value

    # 03: a profiled run
    profiled = config_mod.load("tiny", ["train.max_steps=12", "profile.enabled=true", f"data.workspace={ws_dir}"])
    assert launch.start(profiled, runs_root=tmp_path / "runs").wait(120) == 0
    assert ticks() == [False, True, True, True, True, False], panel.statuses

    (tmp_path / "bigram.py").write_text(BIGRAM_MODEL)
    own = config_mod.load("tiny", ["train.max_steps=5", "model.name=custom", f"data.workspace={ws_dir}",
                                   f"model.factory={tmp_path / 'bigram.py'}:build"])
    assert launch.start(own, runs_root=tmp_path / "runs").wait(120) == 0
    assert ticks()[5] and "1 completed run(s) of your own nn.Module" in panel.static_html()
    assert len(panel.statuses) == len(STEPS) == 6
