"""The deployment panel driven as a person would drive it (fill the form, click, wait), against a real trained run,
a real export and a real endpoint. One export and one endpoint serve the whole module: they take seconds each."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import pytest

from toolkit.deploy.export import read_manifest
from toolkit.catalogue.model_registry import get_model
from toolkit.catalogue.workspace import Workspace
from widgets.deployment import DeploymentPanel

from served_model import SERVED_FLAGS


def shown(widget) -> str:
    """What an HTML widget says, as text (messages are HTML-escaped)."""
    return html.unescape(widget.value)


def click_with(panel, field: str, value, button: str):
    """Click ``button`` with one form field set to ``value`` (restored after); returns what the button's method
    returned (None when it was refused)."""
    widget = getattr(panel, field)
    good, widget.value = widget.value, value
    try:
        panel.buttons[button].click()
        return panel.wait()
    finally:
        widget.value = good


@pytest.fixture(scope="module")
def module_workspace(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAINBOOK_WORKSPACE", str(tmp_path_factory.mktemp("workspace")))
        yield


@pytest.fixture(autouse=True)
def private_workspace(module_workspace):
    """Overrides conftest's per-test workspace: the model registered by one test is served by the next."""


@pytest.fixture(scope="module")
def panel(module_workspace, tmp_path_factory, finished_runs):
    """A panel whose Export button was clicked on a copy of a tiny run (the endpoint tests' shared one: the Export
    button writes into the run)."""
    root = tmp_path_factory.mktemp("deploy")
    shutil.copytree(finished_runs(*SERVED_FLAGS).path, root / "run")
    panel = DeploymentPanel(root / "run", endpoint_name="tb-test", prompt="def ", max_new_tokens=8,
                            plan_dir=root / "plan").show()
    panel.buttons["Export"].click()
    assert all(b.disabled for b in panel.buttons.values()), "no second click while the export runs"
    panel.wait()
    yield panel
    panel.close()


@pytest.fixture(scope="module")
def served(panel):
    panel.buttons["Start endpoint"].click()
    assert panel.wait() is panel.endpoint and panel.running, panel.outcomes["endpoint"].value
    return panel


def test_export_writes_and_registers_the_model_and_shows_parity(panel):
    assert "exported in" in panel.outcomes["export"].value and "#d62728" not in panel.outcomes["export"].value
    manifest = read_manifest(panel.result.path)  # the model folder with its manifest
    assert manifest["files"]["model.onnx"]["size"] > 0
    parity = json.loads((panel.result.path / "parity.json").read_text())
    assert parity["max_abs_diff"] <= 1e-4
    table = shown(panel.sections["export"])
    assert f"{parity['max_abs_diff']:.2e}" in table and "within the 0.0001 target" in table
    assert table.count("pass") == 3, "one row per shape compared"
    assert panel.model.ref == "tiny:1" and "tiny:1" in table
    assert get_model(Workspace.open(), "tiny:1").path.is_dir()
    assert not panel.buttons["Start endpoint"].disabled and not panel.buttons["Write Azure ML plan"].disabled
    # 30 steps of the tiny model: said beside the export, with what to expect of its answers
    assert "trained 30 steps: validation" in table and "expect mostly gibberish" in table, table
    assert "Send needs a running endpoint; no endpoint yet: Start endpoint." in shown(panel.sections["answer"])


def test_bad_endpoint_name_is_refused_inline_and_starts_nothing(panel):
    assert click_with(panel, "endpoint_name", "../elsewhere", "Start endpoint") is None
    assert "endpoint: '../elsewhere' is not allowed" in shown(panel.outcomes["endpoint"])
    assert panel.endpoint is None and not panel.running


def test_the_prompt_box_sends_a_real_request_and_shows_the_answer_and_latency(served):
    panel = served
    status = shown(panel.sections["endpoint"])
    assert panel.endpoint.scoring_url in status and "running" in status
    assert panel.endpoint.key not in status and panel.endpoint.key[:4] in status, "the key is masked"
    panel.temperature.value = 0.0  # greedy: the same prompt gives the same answer
    panel.buttons["Send"].click()
    answer = panel.wait()
    assert answer["status"] == 200 and answer["new_tokens"] == 8 and answer["client_ms"] > 0
    assert answer["timing_ms"]["server"] > 0
    assert panel.endpoint.request({"prompt": "def ", "max_new_tokens": 8, "temperature": 0.0})[1]["text"] == \
        answer["text"], "the panel's request is a real one"
    assert answer["text"] in shown(panel.sections["answer"])
    assert f"{answer['client_ms']:.1f} ms measured here" in shown(panel.sections["answer"])
    assert "p50" in panel.sections["history"].value


@pytest.mark.parametrize("field, value, says", [("prompt", "", "prompt: empty"),
                                                ("max_new_tokens", 0, "max_new_tokens: 0 is not allowed")])
def test_a_bad_request_shows_the_servers_400_inline(served, field, value, says):
    panel = served
    answer = click_with(panel, field, value, "Send")
    assert answer["status"] == 400 and says in answer["error"]
    assert "HTTP 400: " + says in shown(panel.sections["answer"]) and "#d62728" in panel.sections["answer"].value
    assert panel.running, "a bad request leaves the endpoint serving"


def test_the_plan_button_checks_the_vm_size_then_writes_and_lists_the_files(panel):
    assert click_with(panel, "sku", "Standard_Tiny_v9", "Write Azure ML plan") is None
    # beside the button, under the label the form shows (not the command line's --sku)
    said = shown(panel.outcomes["plan"])
    assert "VM size: 'Standard_Tiny_v9' is not a known VM size" in said and "--sku" not in said, said
    assert "exported in" in panel.outcomes["export"].value, "another section's line keeps what it said"
    # served locally under any folder-safe name, but Azure ML's endpoint names are stricter
    assert click_with(panel, "endpoint_name", "tb_test", "Write Azure ML plan") is None
    said = shown(panel.outcomes["plan"])
    assert "endpoint: 'tb_test' is not allowed" in said and "VM size" not in said, "the new error replaces the old"
    assert not Path(panel.plan_dir.value).exists(), "nothing is written before everything is checked"
    panel.buttons["Write Azure ML plan"].click()
    folder = panel.wait()
    assert sorted(p.name for p in folder.iterdir()) == ["deploy.md", "deployment.yaml", "endpoint.yaml",
                                                         "environment.yml"]
    listed = shown(panel.sections["plan"])
    assert all(f"{name}</td><td style='text-align:left'>{(folder / name).stat().st_size:,}" in listed
               for name in ("deploy.md", "deployment.yaml", "endpoint.yaml", "environment.yml")), "names and sizes"
    assert (folder / "endpoint.yaml").read_text() in listed, "endpoint.yaml's text"


def test_stop_ends_the_server_and_the_static_twin_shows_the_same(served):
    panel = served
    process = panel.endpoint.process
    panel.buttons["Stop endpoint"].click()
    panel.wait()
    assert process.poll() is not None and not panel.running
    assert "stopped" in panel.sections["endpoint"].value and panel.buttons["Send"].disabled
    # the greyed Send says why and what to do, in the live view and the static twin
    hint = "the endpoint is stopped: Start endpoint to send again"
    assert hint in shown(panel.sections["answer"]) and hint in html.unescape(panel.static_html())
    static = panel.static_html()
    assert all(section.value in static for section in panel.sections.values())
    assert "within the 0.0001 target" in static and "stopped" in static
    assert panel.endpoint.key not in static


def test_buttons_explain_what_comes_first(tmp_path):
    panel = DeploymentPanel(tmp_path / "no-run", plan_dir=tmp_path / "plan")
    assert panel.buttons["Start endpoint"].disabled and panel.buttons["Send"].disabled
    assert "no endpoint yet: Export, then Start endpoint" in shown(panel.sections["answer"])
    assert panel.buttons["Start endpoint"].tooltip == "Export first"
    panel.buttons["Start endpoint"].click()  # greyed out in a browser; a click that reaches the kernel does nothing
    panel.wait()
    assert panel.endpoint is None and panel.outcomes["endpoint"].value == ""
    panel.buttons["Export"].click()
    panel.wait()
    assert "is not a run directory" in shown(panel.outcomes["export"]) and panel.result is None
    assert not panel.buttons["Export"].disabled, "buttons come back after a refusal"
