"""The deployment panel: export, parity, a local endpoint with a prompt box, and the Azure ML plan, in one view.

    panel = DeploymentPanel(run_dir, endpoint_name="tb-demo").show()   # initial values: the notebook's parameters
    panel.export()           # what the Export button does (and registers the model when "register" is ticked)
    panel.start_endpoint()   # Start endpoint;  panel.send() sends the prompt box;  panel.stop_endpoint()
    panel.write_plan()       # Write Azure ML plan
    panel.close()            # stops the endpoint if it still runs

Every button is one toolkit call (export_run + register_model / serve / LocalEndpoint.request / stop /
build_deployment_plan + write_deployment_plan); the panel holds no deployment logic. A button runs its method in a
background thread, so the kernel stays free during an export (seconds) or an endpoint start; meanwhile the line
beside that button's row says what is happening (then how it ended, or its error) and the buttons are disabled.
``wait()`` blocks until that work ends (scripts, tests); the methods themselves are synchronous and raise, so a
headless notebook fails loudly. Bad input comes back as the toolkit's or the server's own message (its field named
by this form's label), shown inline in red. Everything the live view shows is also rendered as static HTML through
``display_id``, so a papermill-executed notebook keeps the final state.
"""

from __future__ import annotations

import atexit
import contextlib
import html
import statistics
import time
from pathlib import Path
from collections.abc import Callable

import ipywidgets as w
from toolkit import paths
from toolkit.azure.deploy_plan import DeploymentPlan, build_deployment_plan, write_deployment_plan
from toolkit.deploy.export import ExportResult, export_run
from toolkit.catalogue.model_registry import RegisteredModel, register_model
from toolkit.deploy.serving.endpoint import LocalEndpoint, mask_key, serve
from toolkit.deploy.serving.runtimes import RUNTIMES
from toolkit.catalogue.workspace import Workspace
from toolkit.errors import refused
from toolkit.events import EvalEvent, read_events
from widgets.panel import Outcome, Panel, busy_html, error_html, field_row, hint_html, ok_html, warn_html
from toolkit.tables import html_table

HISTORY_ROWS = 10  # the latest requests shown; the p50 covers them all
# Above this validation loss (bits per byte) a byte-level model writes mostly gibberish.
GIBBERISH_BPB = 2.0
# The view's sections, in order, with their headings (the history sits under the prompt's answer).
HEADINGS = {
    "export": "Export",
    "endpoint": "Local endpoint",
    "answer": "Prompt",
    "history": "",
    "plan": "Azure ML plan",
}


def _heading(section: str) -> str:
    text = HEADINGS[section]
    return f"<div style='font-weight:bold;margin-top:8px'>{html.escape(text)}</div>" if text else ""


def _pre(text: str) -> str:
    return f"<pre style='white-space:pre-wrap;margin:4px 0'>{text}</pre>"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _short(text: str, limit: int = 32) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


class DeploymentPanel(Panel):
    title = "Deployment"
    # the toolkit's names (the command line's flags, the server's fields) as this form labels them
    field_labels = {"--sku": "VM size", "--endpoint": "endpoint", "name": "endpoint", "run_dir": "run"}

    def __init__(
        self,
        run_dir: str | Path,
        runtime: str = "onnx",
        endpoint_name: str = "tb-demo",
        prompt: str = "The ",
        max_new_tokens: int = 48,
        temperature: float = 0.8,
        sku: str = "Standard_DS3_v2",
        plan_dir: str | Path | None = None,
        register: bool = True,
    ):
        super().__init__()
        wide = w.Layout(width="70%")
        self.run_dir = w.Text(value=str(run_dir), description="run", layout=wide)
        self.register = w.Checkbox(
            value=register,
            description="register",
            tooltip="register the export in the workspace as the next version of the model",
        )
        self.runtime = w.Dropdown(options=list(RUNTIMES), value=runtime, description="runtime")
        self.endpoint_name = w.Text(value=endpoint_name, description="endpoint")
        self.prompt = w.Textarea(value=prompt, description="prompt", layout=wide)
        self.max_new_tokens = w.IntText(value=max_new_tokens, description="new tokens")
        self.temperature = w.FloatText(value=temperature, description="temperature")
        self.sku = w.Text(value=sku, description="VM size")
        self.plan_dir = w.Text(
            value=str(plan_dir or paths.PROJECT_ROOT / "outputs" / "azure-deploy-plan"),
            description="plan folder",
            layout=wide,
        )
        # The form leaves range checks to the toolkit and the server, so their own messages are what you see, on
        # the line under the row of the button that was clicked (one per section: a second error elsewhere does not
        # overwrite the first).
        self.outcomes = {section: Outcome() for section in ("export", "endpoint", "answer", "plan")}
        self.buttons = {
            label: self.button(label, self._in_background(method, section), style, outcome=self.outcomes[section])
            for label, method, style, section in (
                ("Export", self.export, "primary", "export"),
                ("Start endpoint", self.start_endpoint, "success", "endpoint"),
                ("Stop endpoint", self.stop_endpoint, "", "endpoint"),
                ("Send", self.send, "info", "answer"),
                ("Write Azure ML plan", self.write_plan, "", "plan"),
            )
        }
        self.sections = {name: w.HTML() for name in HEADINGS}
        b, s, o = self.buttons, self.sections, self.outcomes
        self.view = w.VBox(
            [
                w.HTML(_heading("export")),
                field_row([self.run_dir, self.register, b["Export"]]),
                o["export"].view,
                s["export"],
                w.HTML(_heading("endpoint")),
                field_row([self.runtime, self.endpoint_name, b["Start endpoint"], b["Stop endpoint"]]),
                o["endpoint"].view,
                s["endpoint"],
                w.HTML(_heading("answer")),
                self.prompt,
                field_row([self.max_new_tokens, self.temperature, b["Send"]]),
                o["answer"].view,
                s["answer"],
                s["history"],
                w.HTML(_heading("plan")),
                field_row([self.sku, self.plan_dir, b["Write Azure ML plan"]]),
                o["plan"].view,
                s["plan"],
            ]
        )
        self.result: ExportResult | None = None
        self.trained: list[EvalEvent] = []  # the exported run's last evaluation
        self.model: RegisteredModel | None = None
        self.endpoint: LocalEndpoint | None = None
        self.answers: list[dict] = []  # every request sent from the prompt box, with its latencies
        self.plan: DeploymentPlan | None = None
        self.plan_folder: Path | None = None
        self._plan_files: list[dict] = []
        self._endpoint_yaml = ""
        self._doing: str | None = None  # what the panel is busy with (the status line), None when idle
        self.refresh()

    # --- the toolkit calls behind the buttons -----------------------------------------------------------------

    def export(self) -> ExportResult:
        """Export the run (safetensors, ONNX, parity) and, with "register" ticked, register it as a model."""
        with self._working("export", "exporting", "exported"):
            self.result, self.model = export_run(self.run_dir.value), None
            # the quality of the checkpoint exported (the newest valid one, maybe older than the last evaluation)
            step = self.result.manifest.get("step")
            self.trained = [
                e for e in read_events(self.run_dir.value, EvalEvent) if isinstance(step, int) and e.step <= step
            ][-1:]
            if self.register.value:
                self.outcomes["export"].doing.value = busy_html("registering")
                self.model = register_model(Workspace.open(), self.result.path)
        return self.result

    def start_endpoint(self) -> LocalEndpoint:
        """Serve the export (its registered version when there is one) on 127.0.0.1 with a key."""
        if self.running:
            raise RuntimeError(refused("endpoint", f"{self.endpoint.name} is running", "stop it first"))
        model = self._model()
        with self._working("endpoint", "starting the endpoint", "endpoint started"):
            self.endpoint = serve(model, runtime=self.runtime.value, name=self.endpoint_name.value)
            # The server runs in its own session and would outlive a kernel that exits without close().
            atexit.register(self.endpoint.stop)
        return self.endpoint

    def stop_endpoint(self) -> None:
        if self.endpoint is None:
            return
        with self._working("endpoint", "stopping the endpoint", "endpoint stopped"):
            self.endpoint.stop()
            atexit.unregister(self.endpoint.stop)

    def send(self) -> dict:
        """POST the prompt box to the endpoint with its key; returns the server's JSON with ``status`` (HTTP),
        ``prompt`` and ``client_ms`` added. A refusal (400 naming the field) is an answer, shown in red."""
        if not self.running:
            raise RuntimeError(refused("endpoint", "not running", "Start endpoint first"))
        body = {
            "prompt": self.prompt.value,
            "max_new_tokens": self.max_new_tokens.value,
            "temperature": self.temperature.value,
        }
        with self._working("answer", "sending", "answered"):
            started = time.perf_counter()
            status, answer = self.endpoint.request(body)
            answer = {
                **answer,
                "status": status,
                "prompt": body["prompt"],
                "client_ms": 1000 * (time.perf_counter() - started),
            }
            self.answers.append(answer)
        return answer

    def write_plan(self) -> Path:
        """Write the Azure ML managed online endpoint and deployment for the model (endpoint name, VM size and
        runtime from the form); the toolkit checks them before anything is written."""
        model = self._model()
        with self._working("plan", "writing the Azure ML plan", "plan written"):
            self.plan = build_deployment_plan(
                model, endpoint=self.endpoint_name.value, sku=self.sku.value, runtime=self.runtime.value
            )
            self.plan_folder = write_deployment_plan(self.plan, self.plan_dir.value)
            self._plan_files = [
                {"file": p.name, "bytes": f"{p.stat().st_size:,}"} for p in sorted(self.plan_folder.iterdir())
            ]
            self._endpoint_yaml = (self.plan_folder / "endpoint.yaml").read_text()
        return self.plan_folder

    def close(self) -> None:
        """Stop the endpoint the panel started (after any button's work in progress)."""
        self.wait()
        if self.running:
            self.stop_endpoint()

    def _model(self) -> str:
        """What to serve and deploy: the registered version when there is one (it never changes), else the export."""
        if self.result is None:
            raise ValueError(refused("model", "nothing exported yet", "Export first"))
        return self.model.ref if self.model else str(self.result.path)

    @property
    def running(self) -> bool:
        return self.endpoint is not None and self.endpoint.process.poll() is None

    # --- background work --------------------------------------------------------------------------------------

    def _in_background(self, method: Callable[[], object], section: str) -> Callable[[], None]:
        """What a button does: ``method`` in a background thread (the line under its row says what it does), every
        button disabled until it ends, then only the ones that make sense."""
        return lambda: self.in_background("", method, self.buttons.values(), self.outcomes[section])

    def after_task(self) -> None:
        self._set_buttons()  # also when the method refused before it started working

    @contextlib.contextmanager
    def _working(self, section: str, doing: str, done: str):
        """What a step is doing, on its section's line, and the buttons disabled while it runs; then how long it
        took, in place of what it said before; the view redrawn after it, whatever happened."""
        line = self.outcomes[section]
        self._doing, started = doing, time.monotonic()
        line.say("")
        line.doing.value = busy_html(doing)
        self._set_buttons()
        try:
            yield
            line.say(hint_html(f"{done} in {time.monotonic() - started:.1f} s"))
        finally:  # an error itself is shown by guarded() on the same line, or raised to the caller
            line.doing.value = ""
            self._doing = None
            self.refresh()

    def _set_buttons(self) -> None:
        busy = f"busy {self._doing}" if self._doing is not None else ""
        not_exported = "" if self.result is not None else "Export first"
        b = self.buttons
        self.allow(b["Export"], busy)
        self.allow(b["Start endpoint"], busy or not_exported or ("the endpoint is running" if self.running else ""))
        for label in ("Stop endpoint", "Send"):
            self.allow(b[label], busy or ("" if self.running else "no endpoint is running"))
        self.allow(b["Write Azure ML plan"], busy or not_exported)

    # --- drawing: one HTML string per section, for the live view and the static twin alike -------------------------

    def _export_html(self) -> str:
        if self.result is None:
            return html_table([], empty="not exported yet")
        parity = self.result.parity
        target = parity["target"]
        verdict_column = f"≤ {target:g}"
        rows = [
            {
                "batch x sequence": " x ".join(map(str, s["shape"])),
                "values compared": f"{s['values']:,}",
                "max |torch − onnxruntime|": f"{s['max_abs_diff']:.2e}",
                verdict_column: "pass" if s["max_abs_diff"] <= target else "FAIL",
            }
            for s in parity["shapes"]
        ]
        verdict = (ok_html if self.result.parity_ok else error_html)(
            f"parity: max |torch − onnxruntime| = {parity['max_abs_diff']:.2e}, "
            f"{'within' if self.result.parity_ok else 'OVER'} the {target:g} target"
        )
        registered = (
            f"registered as <b>{html.escape(self.model.ref)}</b>"
            if self.model
            else "not registered (served from the export folder)"
        )
        return (
            f"<div><code>{html.escape(str(self.result.path))}</code></div>"
            f"{html_table(rows, highlight=lambda r: '#fdd' if r[verdict_column] == 'FAIL' else '')}"
            f"<div>{verdict} · {registered}</div>{self._quality_html()}"
        )

    def _quality_html(self) -> str:
        """How trained the exported model is, with a warning where its answers will not read as text."""
        if not self.trained or self.trained[0].val_bpb is None:
            return ""
        e = self.trained[0]
        said = f"trained {e.step:,} steps: validation {e.val_bpb:.2f} bits per byte"
        if e.val_bpb <= GIBBERISH_BPB:
            return f"<div style='color:#666'>{said}</div>"
        return warn_html(
            f"{said}, above {GIBBERISH_BPB:g}: expect mostly gibberish. Below about {GIBBERISH_BPB:g} a byte-level "
            "model's answers start to read as text: train longer (notebook 03, or more steps) and export that run."
        )

    def _endpoint_html(self) -> str:
        e = self.endpoint
        if e is None:
            return html_table([], empty="not started")
        code = e.process.poll()
        return html_table(
            [
                {
                    "endpoint": e.name,
                    "scoring URL": e.scoring_url,
                    "key": mask_key(e.key),
                    "runtime": e.runtime,
                    "state": "running" if code is None else f"stopped (exit {code})",
                }
            ]
        )

    def _answer_html(self) -> str:
        return self._send_hint() + self._last_answer_html()

    def _send_hint(self) -> str:
        """Why Send is greyed out, when it is for want of an endpoint."""
        if self.running or self._doing is not None:
            return ""
        why = (
            "the endpoint is stopped: Start endpoint to send again"
            if self.endpoint is not None
            else "no endpoint yet: Export, then Start endpoint"
            if self.result is None
            else "no endpoint yet: Start endpoint"
        )
        return f"<div style='color:#888'>Send needs a running endpoint; {why}.</div>"

    def _last_answer_html(self) -> str:
        if not self.answers:
            return ""
        a = self.answers[-1]
        if a["status"] != 200:  # the server names the field, the value and what is allowed
            return error_html(f"HTTP {a['status']}: {a.get('error', '')}")
        timing = a.get("timing_ms", {})
        server = ", ".join(f"{k} {_ms(timing.get(k))}" for k in ("queue", "compute", "server") if k in timing)
        return (
            _pre(f"{html.escape(a['prompt'])}<b>{html.escape(a.get('text', ''))}</b>")
            + f"<div style='color:#666'>{a.get('new_tokens', 0)} new tokens · {a['client_ms']:.1f} ms measured "
            f"here · server timing_ms: {html.escape(server)}</div>"
        )

    def _history_html(self) -> str:
        if not self.answers:
            return ""
        rows = [
            {
                "#": i,
                "status": a["status"],
                "prompt": _short(a["prompt"]),
                "new tokens": a.get("new_tokens", ""),
                "client ms": f"{a['client_ms']:.1f}",
                "server ms": _ms(a.get("timing_ms", {}).get("server")),
            }
            for i, a in enumerate(self.answers, 1)
        ][::-1][:HISTORY_ROWS]
        answered = [a["client_ms"] for a in self.answers if a["status"] == 200]
        p50 = f"p50 {statistics.median(answered):.1f} ms over {len(answered)} answered" if answered else "none answered"
        return f"<div style='color:#666;font-size:0.9em'>requests: {len(self.answers)}, {p50}</div>" + html_table(
            rows, highlight=lambda r: "#fdd" if r["status"] != 200 else ""
        )

    def _plan_html(self) -> str:
        if self.plan_folder is None:
            return html_table([], empty="not written yet")
        return (
            f"<div><code>{html.escape(str(self.plan_folder))}</code></div>{html_table(self._plan_files)}"
            f"<div>endpoint.yaml</div>{_pre(html.escape(self._endpoint_yaml))}"
        )

    def _sections_html(self) -> dict[str, str]:
        return {
            "export": self._export_html(),
            "endpoint": self._endpoint_html(),
            "answer": self._answer_html(),
            "history": self._history_html(),
            "plan": self._plan_html(),
        }

    def refresh(self) -> None:
        for name, text in self._sections_html().items():
            self.sections[name].value = text
        self._set_buttons()
        self.update_static()

    def static_html(self) -> str:
        """The same sections as plain HTML: what a notebook shows without a live kernel."""
        said = {name: f"<div>{line.value}</div>" for name, line in self.outcomes.items() if line.value}
        body = "".join(_heading(name) + said.get(name, "") + text for name, text in self._sections_html().items())
        return f"<div><b>{self.title}</b>{body}</div>"
