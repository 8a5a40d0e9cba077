"""The map of the course: the six steps, what each does in Azure ML's terms, and how far this workspace got.

    JourneyPanel(workspace=None).show()     # a table with a done / to-do badge per step, and a Refresh button

Each tick comes from what that step itself leaves behind, never from another step's traces, so it is the same
whether the steps were done in the notebooks, the terminal or a batch job, and skipping a step leaves it "to do":
01 the doctor's report with every required check passed; 02 a data asset of the user's own (not the built-in
corpora that 01 and 06 register, nor 06's tokenizer); 03 a completed run with profiler traces (04 and 06 train
unprofiled); 04 a run resumed from a checkpoint; 05 a registered model served at an endpoint; 06 a completed run
of a Hugging Face model or a module of the user's own.
"""

from __future__ import annotations

import html
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as w

from toolkit.events import ProfileEvent, StatusEvent, read_events
from toolkit.rundir import RunDir
from toolkit.catalogue.workspace import Workspace
from widgets.panel import Panel, badge_html, hint_html


@dataclass(frozen=True)
class Step:
    notebook: str
    title: str
    azure_ml: str  # the guide's concept the step stands in for
    status: Callable[[Workspace], tuple[bool, str]]  # (done, what is there)


def _machine(ws: Workspace) -> tuple[bool, str]:
    """Done once the doctor passed every required check (its report, kept in the workspace)."""
    import psutil

    from toolkit.resources.doctor import last_report, verdict

    machine = f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    report = last_report(ws.root)
    if report is None:
        return False, f"{machine}; the doctor has not checked it yet"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(report["time"]))
    failed, skipped = verdict(report)
    if failed:
        return False, f"{machine}; the doctor ({when}) FAILED: {', '.join(failed)}"
    if skipped:
        return False, f"{machine}; the doctor ({when}) skipped required checks: {', '.join(skipped)}"
    warned = sum(c["status"] == "warn" for c in report["checks"])
    return True, f"{machine}; the doctor passed ({when}, {warned} warning(s))"


def _data(ws: Workspace) -> tuple[bool, str]:
    """Done once a file of the user's own is registered: not the built-in corpora that 01 and 06 register, nor a
    tokenizer trained here (06)."""
    from toolkit.catalogue.data_assets import list_assets
    from toolkit.data.builtin import is_builtin
    from toolkit.data.tokenizers import is_tokenizer

    assets = list_assets(ws)
    made_here = sorted({a.ref for a in assets if is_builtin(a) or is_tokenizer(a)})
    own = sorted({a.ref for a in assets} - set(made_here))
    parts = ([f"{len(own)} version(s) of your own: {', '.join(own[:4])}"] if own else ["none of your own yet"]) + (
        [f"built-in or made here: {', '.join(made_here[:4])}"] if made_here else []
    )
    return bool(own), "; ".join(parts)


def _runs(ws: Workspace) -> list[dict]:
    from toolkit.runs.run_index import list_runs

    return [r for r in list_runs(ws.root) if Path(r["run_dir"]).is_dir()]


def _training(ws: Workspace) -> tuple[bool, str]:
    """Done once a run completed with the profiler on (04 and 06 turn it off for their runs)."""
    runs = _runs(ws)
    if not runs:
        return False, "no runs yet"
    completed = [r for r in runs if r["state"] == "completed"]
    profiled = [r for r in completed if read_events(r["run_dir"], ProfileEvent)]
    latest = runs[0]
    return bool(profiled), (
        f"{len(runs)} run(s), {len(completed)} completed, {len(profiled)} of them profiled; "
        f"latest {Path(latest['run_dir']).name}: {latest['state']} at step {latest['step']}"
    )


def _checkpoints(ws: Workspace) -> tuple[bool, str]:
    from toolkit.checkpoint.store import CheckpointStore

    with_checkpoints = [r for r in _runs(ws) if CheckpointStore(r["run_dir"]).latest_name()]
    resumed = [r for r in with_checkpoints if any(e.resumed_from for e in read_events(r["run_dir"], StatusEvent))]
    return bool(resumed), (
        f"{len(with_checkpoints)} run(s) with checkpoints, {len(resumed)} resumed"
        if with_checkpoints
        else "no checkpoints yet"
    )


def _deployment(ws: Workspace) -> tuple[bool, str]:
    """Done once a registered model was served at an endpoint (06 serves an export that is not registered)."""
    from toolkit.catalogue.model_registry import list_models
    from toolkit.deploy.serving.running import recorded_endpoints

    models = list_models(ws)
    if not models:
        return False, "no model registered yet"
    # An endpoint's record is keyed by its name: serving another folder under the same name replaces it
    by_folder = {m.path.resolve(): m.ref for m in models}
    served = [
        f"{e.name} ({by_folder[Path(e.model_dir).resolve()]})"
        for e, _ in recorded_endpoints(ws.root)
        if Path(e.model_dir).resolve() in by_folder
    ]
    return bool(served), (
        f"{len(models)} model version(s): {', '.join(m.ref for m in models[:4])}; "
        + (f"served: {', '.join(served[:4])}" if served else "none served yet")
    )


def _your_model(ws: Workspace) -> tuple[bool, str]:
    """Done once a run trained a model of the user's kind (a Hugging Face one or their own module)."""
    runs = [r for r in _runs(ws) if r["state"] == "completed"]
    names = {}
    for r in runs:
        try:
            model = RunDir(r["run_dir"]).read_config().model.name
        except (OSError, ValueError):  # a run folder changed since it was indexed: not this step's to judge
            continue
        if model in ("hf", "custom"):
            names[model] = names.get(model, 0) + 1
    kinds = {"hf": "Hugging Face", "custom": "your own nn.Module"}
    return bool(names), (
        ", ".join(f"{n} completed run(s) of {kinds[m]}" for m, n in names.items())
        if names
        else "no run of your own model yet"
    )


STEPS = [
    Step(
        "01_resources.ipynb",
        "Resources: check the machine, size the job, plan the cluster",
        "compute cluster, curated environment (ACPT), validating before spending GPU hours",
        _machine,
    ),
    Step(
        "02_data.ipynb",
        "Data: register versioned assets, tune loading",
        "workspace, data assets (uri_file, uri_folder, mltable), data-loading advice",
        _data,
    ),
    Step(
        "03_training.ipynb",
        "Training: launch, follow live, profile, TensorBoard",
        "command job with PyTorch / DeepSpeed distribution, metrics, profiler",
        _training,
    ),
    Step(
        "04_checkpoint_recovery.ipynb",
        "Checkpoints: kill a run, resume it exactly, pick an interval",
        "Nebula-style fast checkpoints, automatic restarts",
        _checkpoints,
    ),
    Step(
        "05_deployment.ipynb",
        "Deployment: export, serve with a key, plan the online endpoint",
        "model registry, managed online endpoint and deployment, score.py",
        _deployment,
    ),
    Step(
        "06_your_model.ipynb",
        "Your model: a Hugging Face architecture, your tokenizer, LoRA, served",
        "bring your own model and environment; fine-tuning a registered model",
        _your_model,
    ),
]


def _status(step: Step, ws: Workspace) -> tuple[bool, str]:
    """A step's status; a record that cannot be read (edited by hand, another version's) leaves it to do, saying
    so, and never stops the table."""
    try:
        return step.status(ws)
    except Exception as exc:  # noqa: BLE001 - one step's unreadable record must not hide the other five
        return False, f"its record could not be read ({type(exc).__name__}: {exc})"


class JourneyPanel(Panel):
    def __init__(self, workspace: str | Path | None = None):
        super().__init__()
        self.ws = Workspace.open(workspace)
        self.table = w.HTML()
        self.refresh_button = self.button("Refresh", self.refresh, tooltip="read the workspace again")
        self.view = w.VBox([self.table, self.refresh_button, self.outcome_of(self.refresh_button).view])
        self.statuses: list[tuple[bool, str]] = []
        self.refresh()

    def refresh(self) -> list[tuple[bool, str]]:
        self.statuses = [_status(step, self.ws) for step in STEPS]
        rows = []
        for step, (done, detail) in zip(STEPS, self.statuses):
            rows.append(
                f"<tr><td style='padding:4px 8px'><a href='{html.escape(step.notebook)}'>{html.escape(step.notebook)}"
                f"</a></td><td style='padding:4px 8px'><b>{html.escape(step.title)}</b><br><span style='color:#666;"
                f"font-size:0.85em'>Azure ML: {html.escape(step.azure_ml)}</span></td><td style='padding:4px 8px'>"
                f"{badge_html('done', '#2ca02c') if done else badge_html('to do', '#aaa')}</td>"
                f"<td style='padding:4px 8px;font-size:0.9em'>{html.escape(detail)}</td></tr>"
            )
        self.table.value = (
            f"<div><b>The journey</b> &middot; workspace <code>{html.escape(str(self.ws.root))}"
            "</code><table style='border-collapse:collapse'><tr><th>notebook</th><th>step</th>"
            f"<th>status</th><th style='text-align:left'>so far</th></tr>{''.join(rows)}</table></div>"
        )
        done = sum(d for d, _ in self.statuses)
        self.outcome_of(self.refresh_button).say(
            hint_html(f"read at {time.strftime('%H:%M:%S')}: {done} of {len(STEPS)} steps done")
        )
        self.update_static()
        return self.statuses

    def static_html(self) -> str:
        return self.table.value + self.outcome_of(self.refresh_button).value
