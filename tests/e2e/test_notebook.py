"""The guided notebooks' outputs. 03 and 00 executed headlessly by papermill here, then re-run and checked by nbval
(--nbval-lax); the course (01, 02, 04, 05, 06) run in JupyterLab by test_browser and checked by the functions here."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import nbformat
import yaml
import pytest

from toolkit.report.demo import NOTEBOOKS, execute, guided_notebooks

pytestmark = pytest.mark.slow

PROFILE_QUICKLY = ["profile.enabled=true", "profile.wait=1", "profile.warmup=1"]


def test_committed_notebooks_have_no_outputs_and_a_parameters_cell():
    assert {"00_overview.ipynb", "01_resources.ipynb", "02_data.ipynb", "03_training.ipynb", "03b_scaling.ipynb",
            "04_checkpoint_recovery.ipynb", "05_deployment.ipynb", "06_your_model.ipynb"} <= {
        p.name for p in guided_notebooks()}
    for path in guided_notebooks():
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), f"{path.name} has outputs"
        assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1, path.name
        # reopened without a kernel, JupyterLab shows this above each panel's static copy: the notebook says why
        assert "Error displaying widget: model not found" in nb.cells[0].source, path.name


def outputs_of(path):
    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    text = "".join(o.get("text", "") for o in outputs)
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    # third-party chatter stays out of the learner's cells: DeepSpeed's accelerator guess (imported through
    # accelerate by save_pretrained) showed under 06's export, transformers' loading bar (stuck at 0% in a saved
    # notebook, a widget whose text/plain says so) under its plain from_pretrained
    shown = text + "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "Setting accelerator" not in shown and "Loading weights" not in shown, shown
    return html, text, pngs


def nbval(executed, cwd):
    """nbval re-executes the executed copy (its injected parameters included) and compares the outputs of the
    cells marked NBVAL_CHECK_OUTPUT with the stored ones."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--nbval-lax", str(executed), "-q", "-p",
                           "no:cacheprovider", "-o", "addopts="], capture_output=True, text=True, cwd=cwd,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "passed" in proc.stdout


def test_training_notebook_runs_headless_and_keeps_its_results(tmp_path):
    runs = tmp_path / "runs"
    executed = execute(NOTEBOOKS / "03_training.ipynb", tmp_path,
                       {"config": "tiny", "runs_root": str(runs), "overrides": PROFILE_QUICKLY})
    html, text, pngs = outputs_of(executed)
    # The live card was updated in place through display_id: the stored copy shows the finished run.
    assert any("completed" in h and "40 / 40" in h for h in html), html
    nb = nbformat.read(executed, as_version=4)
    views = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views, "the live panel's widget view is stored too (rendered by JupyterLab)"
    assert pngs, "loss curve picture missing"
    assert "bits per byte" in text, text
    assert any("<table" in h and "aten::" in h for h in html), "the profiler's top operators, as an HTML table"
    (run_dir,) = runs.iterdir()
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    nbval(executed, tmp_path)


# --- the course: run in a real JupyterLab by test_browser, checked here ---------------------------------------------
#
# 01, 02, 04, 05 and 06 run once per `make test`, in JupyterLab (tests/e2e/test_browser.py: Run All in Chromium),
# with these parameters, in this order; after each, the saved notebook's outputs are checked by its function below,
# and after the course nbval re-runs those it re-runs. Papermill's own execution (what `make demo` and batch runs
# use) is tested on 03 and 00 above and below, and on 03b (test_scaling).

COURSE = ["01_resources", "02_data", "04_checkpoint_recovery", "05_deployment", "06_your_model", "00_overview"]
# nbval's re-runs after the course (01 and 06: their checked cells are asserted below). 05 first: it registers the
# newest tiny run, which must still be the one it registered in the course, before 04's re-run adds two newer ones.
NBVAL = ["05_deployment", "02_data", "04_checkpoint_recovery"]


def course_parameters(tmp_path) -> dict[str, dict]:
    ws, runs, plans = str(tmp_path / "workspace"), str(tmp_path / "runs"), tmp_path / "outputs"
    return {
        "00_overview": {"workspace": ws},
        "01_resources": {"workspace": ws, "checks": ["packages", "all-reduce", "train-torch"],
                         "model_sizes": ["125M", "7B"], "plan_nodes": 1, "plan_dir": str(plans / "azure-plan")},
        "02_data": {"workspace": ws, "config": "tiny", "tune_steps": 5},
        "04_checkpoint_recovery": {"config": "tiny", "steps": 40, "every": 10, "kill_at": 25, "runs_root": runs},
        "05_deployment": {"runs_root": runs, "latency_requests": 10, "max_new_tokens": 8,
                          "plan_dir": str(plans / "azure-plan")},
        "06_your_model": {"workspace": ws, "runs_root": runs, "pretrain_steps": 30, "finetune_steps": 10,
                          "max_new_tokens": 8, "chat_steps": 30},
    }


def check_recovery(executed, tmp_path, runs_before: set) -> None:
    """04: killed, resumed, identical losses; the advisor's C; two runs of its own."""
    runs = tmp_path / "runs"
    html, text, pngs = outputs_of(executed)
    assert "state: killed (signal SIGKILL) right after step 25 (fault.kill_at_step); its last logged line: step 20" \
        in text, text
    # step 20's checkpoint may still have been in flight (written in the background) when the node died
    saved = re.search(r"newest checkpoint: step (\d+), so a resume trains steps (\d+)-25 again", text)
    assert saved and int(saved[1]) in (10, 20) and int(saved[2]) == int(saved[1]) + 1, text
    assert "identical losses at every logged step: True" in text, text
    assert "T = sqrt(2 C M) - C" in text and any("&lt;- LATEST" in h or "<- LATEST" in h for h in html), text
    # the resumed run's card: completed, and the kill it recovered from in grey, not as a red error
    (card,) = {h[h.index("<b>", h.index("border-radius:6px")):] for h in html if "recovered from" in h}
    assert "completed" in card and "signal SIGKILL" in card and "#d62728" not in card, card
    # what survived the kill is printed before the resume, where the learner reads it before the panel moves on
    assert "survived the kill: step_00000010" in text and text.index("survived the kill") < text.index("state: completed")
    # one checkpoint cost: the cell's C is the advisor's
    cell_c = re.search(r"C = ([\d.,]+) ms, the median training time lost per checkpoint", text)
    advisor_c = re.search(r"training time lost ([\d.,]+) ms per checkpoint", text)
    assert cell_c and advisor_c and cell_c[1] == advisor_c[1], text
    assert pngs
    assert len(set(runs.iterdir()) - runs_before) == 2  # the reference and the killed-then-resumed run


def check_data(executed, tmp_path, runs_before: set) -> None:
    """02: versions registered, archived, the loading advisor run."""
    html, text, pngs = outputs_of(executed)
    assert "first: notes:1, unchanged again: notes:1, after the edit: notes:2" in text, text
    assert "notes:1 still reads 'version one'" in text
    assert "archived notes:2 still resolves" in text
    assert "set data.num_workers=" in text or "no setting met the target" in text
    assert pngs, "the advisor's picture is missing"
    assert any("pydoc:1" in h and "digits:1" in h for h in html), "versions table missing"


def check_resources(executed, tmp_path, runs_before: set) -> None:
    """01: the doctor's table, memory sizes, the Azure plan written offline."""
    plan = tmp_path / "outputs" / "azure-plan"
    html, text, pngs = outputs_of(executed)
    # the doctor's live table, stored in its final state: every requested check done, none still running
    final = [h for h in html if "Machine health" in h]
    assert final and "all required checks pass" in final[-1] and "RUNNING" not in final[-1], final
    assert "busbw GB/s" in text and "ZeRO-3: 20 Ψ / 8" in text, text
    # offline, said once, by the panel, in the notebook's own terms (its parameter, not the command line's flag)
    (azure,) = [h for h in html if "OFFLINE" in h]
    assert "azure_config: no config.json at" in azure and "set azure_config to its path" in azure, azure
    assert "--workspace-config" not in azure and "not connected" not in text, text
    assert len(pngs) == 2, "the all-reduce and memory pictures"
    assert sorted(p.name for p in plan.iterdir()) == ["compute.yaml", "data.yaml", "environment.yaml",
                                                      "environment.yml", "job.yaml", "submit.md",
                                                      "trainbook-config.yaml"]
    assert "python -m toolkit.runs.job ${{outputs.runs}}/" in (plan / "job.yaml").read_text()
    # the cluster trains in the precision the memory section sized (the notebook's bf16), not the CPU config's fp32
    assert yaml.safe_load((plan / "trainbook-config.yaml").read_text())["engine"]["precision"] == "bf16"


def check_deployment(executed, tmp_path, runs_before: set) -> None:
    """05: exported within tolerance, served, probed with bad requests, load-tested, planned for Azure."""
    html, text, pngs = outputs_of(executed)
    assert "within the 0.0001 target" in text and "tiny:1: trained in" in text, text
    assert "200: 'The ' -> " in text and "ms measured here, timing_ms {" in text, "the panel's prompt box answered"
    assert "no key             401" in text and "wrong key          401" in text and "empty prompt       400" in text
    assert "max_new_tokens 0   400  max_new_tokens: 0 is not allowed" in text
    assert "score a sentence   200  log-likelihood" in text
    assert "endpoint stopped: True" in text and "16 concurrent clients" in text
    assert "answers: [401, 401, 400, 400, 200]" in text
    assert pngs, "the latency histogram is missing"
    plan = tmp_path / "outputs" / "azure-deploy-plan"
    assert sorted(p.name for p in plan.iterdir()) == ["deploy.md", "deployment.yaml", "endpoint.yaml", "environment.yml"]
    # The panel's static twin, updated in place through display_id, shows the journey's final state.
    (panel,) = [h for h in html if "<b>Deployment</b>" in h]
    assert "within the 0.0001 target" in panel and "registered as <b>tiny:1</b>" in panel
    assert "stopped (exit" in panel and "p50" in panel and "endpoint.yaml" in panel and "plan written in" in panel


def test_overview_notebook_maps_the_journey(tmp_path):
    executed = execute(NOTEBOOKS / "00_overview.ipynb", tmp_path, {"workspace": str(tmp_path / "ws")})
    html, text, _ = outputs_of(executed)
    assert "0 of 6 steps have something to show" in text, text  # a fresh workspace: nothing done yet
    assert any("The journey" in h and "05_deployment.ipynb" in h and "to do" in h for h in html), html
    nbval(executed, tmp_path)


def check_your_model(executed, tmp_path, runs_before: set) -> None:
    """06: a tokenizer, pretraining, two fine-tunes, an export served and called, the chat path."""
    html, text, pngs = outputs_of(executed)
    assert "tokenizer: pydoc-bpe512:1, 512 ids" in text and "bytes/token" in text, text
    assert "a transformers folder (from_pretrained loads it)" in text and "registered as llama-docs:1" in text
    (table,) = [h for h in html if "held-out code, before and after" in h]
    assert "LoRA r=8" in table and "full fine-tune" in table, table
    assert pngs, "the fine-tuning picture"
    assert "the endpoint and plain transformers agree: True" in text, text
    assert "class Stack:\n    def __init__(self|" in text, text  # the greedy answer, printed as code after its prompt
    (shaded,) = [h for h in html if "trainbook-token-bits" in h]
    before, after = map(float, re.search(r"pretrained on docs (\d+\.\d+), after LoRA r=8 (\d+\.\d+)", shaded).groups())
    assert 0 < after < before, shaded  # fine-tuning on code made unseen code more expected
    assert any("completed" in h and "30 / 30" in h for h in html), "the pretraining panel's static twin"
    # the chat path: evaluated against its starting weights, then called through the openai package, streamed too
    (evaluated,) = [h for h in html if "held-out prompts answered (greedy)" in h]
    assert "What does" in evaluated and "against its starting weights" in evaluated, evaluated
    assert "the chat fine-tune lowered the held-out loss: True" in text, text
    assert "streamed and whole answers agree: True" in text, text
    assert "finish: stop" in text or "finish: length" in text, text
    # No nbval re-run: the notebook's longest (~40 s of CPU: a tokenizer, three trainings, two exports, a server),
    # and its two checked cells are asserted above.


CHECKS = {"01_resources": check_resources, "02_data": check_data, "04_checkpoint_recovery": check_recovery,
          "05_deployment": check_deployment, "06_your_model": check_your_model}
