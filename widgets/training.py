"""The training panel: a launcher form and a live dashboard, in one line of a notebook.

    panel = TrainingPanel(config="demo", engine="torch", nproc=1)   # initial values: the notebook's parameters
    panel.show()       # the form, the buttons, the dashboard, and its static twin
    panel.start()      # what the Start button does; panel.wait() blocks until the run ends (headless runs)

Every button is one toolkit call (launch.start / handle.stop / handle.kill / launch.resume /
tb_server.start_tensorboard); the panel holds no training logic. Training runs in its own process group, and a
background thread tails events.jsonl, so the kernel stays free. The plot is redrawn at most every
``plot_every_s`` seconds, so a fast run does not flood the front end. Everything the live view shows is also
rendered as static HTML (the card and the plot as an inline PNG) through ``display_id``: a papermill-executed
notebook keeps the final state without a live kernel.
"""

from __future__ import annotations

import html
import threading
import time
from pathlib import Path

import ipywidgets as w
from toolkit import config as config_mod
from toolkit.errors import refused
from toolkit.runs import launch
from toolkit.report import plots
from toolkit.events import read_events
from toolkit.runs.progress import RunProgress
from toolkit.rundir import RunDir
from toolkit.status import FINAL_STATES, RESUMABLE_STATES
from widgets.panel import Outcome, Panel, plot_png, png_html, warn_html
from widgets.run_progress import progress_card


class TrainingPanel(Panel):
    # the config keys the form sets, as its labels say them (the key kept: it is what `--set` and YAML take)
    field_labels = {
        "train.max_steps": "steps (train.max_steps)",
        "checkpoint.every_steps": "ckpt every (checkpoint.every_steps)",
        "engine.nproc": "processes (engine.nproc)",
        "train.grad_accum_steps": "grad accum (train.grad_accum_steps)",
    }

    def __init__(
        self,
        config: str = "demo",
        engine: str = "torch",
        nproc: int = 1,
        zero_stage: int = 0,
        steps: int | None = None,
        checkpoint_every: int = 0,
        profile: bool = True,
        model: str = "",
        tokenizer: str = "",
        deepspeed_config: str = "",
        grad_accum_steps: int = 1,
        precision: str = "",
        activation_checkpointing: bool = False,
        overrides: list[str] | tuple = (),
        runs_root: str | Path | None = None,
        plot_every_s: float = 2.0,
    ):
        super().__init__()
        self.overrides, self.runs_root, self.plot_every_s = list(overrides), runs_root, plot_every_s
        self.config = w.Dropdown(
            options=sorted({*config_mod.builtin_config_names(), config}), value=config, description="config"
        )
        self.engine = w.Dropdown(
            options=config_mod.field_choices(config_mod.EngineConfig, "name"), value=engine, description="engine"
        )
        self.nproc = w.BoundedIntText(value=nproc, min=1, max=64, description="processes")
        self.zero_stage = w.Dropdown(options=[0, 1, 2, 3], value=zero_stage, description="ZeRO stage")
        # 0 means "the config's own value": said in the label, where a bare 0 would read as zero steps
        self.steps = w.IntText(
            value=steps or 0, description="steps (0: config's)", tooltip="0 keeps the config's max_steps"
        )
        self.checkpoint_every = w.IntText(
            value=checkpoint_every,
            description="ckpt every (0: at end)",
            tooltip="checkpoint every N steps; 0 only at the end",
        )
        self.profile = w.Checkbox(value=profile, description="profile")
        # Your own model in one string (toolkit.train.models.model_overrides): an import path or an HF folder.
        self.model = w.Text(
            value=model,
            description="your model",
            placeholder="the config's model",
            tooltip="package.module:function, path/to/file.py:function, or a save_pretrained folder",
            layout=w.Layout(width="420px"),
        )
        self.tokenizer = w.Text(
            value=tokenizer,
            description="tokenizer",
            placeholder="the config's (auto)",
            tooltip="bytes, model (the HF folder's), a registered name[:version], or a folder with tokenizer.json",
            layout=w.Layout(width="300px"),
        )
        # Scaling settings: each is sent only when it differs from the config's own, so that a DeepSpeed file's
        # values (its stage, accumulation, precision) are taken rather than contradicted
        self.deepspeed_config = w.Text(
            value=deepspeed_config,
            description="ds_config",
            placeholder="none",
            tooltip="your DeepSpeed config (JSON or YAML); its zero_optimization.stage decides the stage",
            layout=w.Layout(width="420px"),
        )
        self.grad_accum = w.BoundedIntText(
            value=grad_accum_steps,
            min=1,
            max=4096,
            description="grad accum",
            tooltip="micro-batches per optimizer step",
        )
        self.precision = w.Dropdown(
            options=[("config's", ""), ("fp32", "fp32"), ("bf16", "bf16"), ("fp16 (GPU)", "fp16")],
            value=precision,
            description="precision",
        )
        self.activation_checkpointing = w.Checkbox(value=activation_checkpointing, description="act. checkpointing")
        self.deepspeed_view = w.HTML()
        self.actions = Outcome()  # beside the buttons: what the last one started says, or its error
        self.buttons = {
            name: self.button(name, getattr(self, name.lower()), style, outcome=self.actions)
            for name, style in (
                ("Start", "primary"),
                ("Stop", ""),
                ("Kill", "danger"),
                ("Resume", ""),
                ("TensorBoard", "info"),
            )
        }
        # shown only for an opened run from elsewhere whose config runs code, reaches an address or opens a port
        self.trust_run = w.Checkbox(
            value=False,
            description="trust this run's config (code, addresses, port)",
            layout=w.Layout(display="none", width="auto"),
        )
        self.progress = w.FloatProgress(min=0.0, max=1.0, description="0%", layout=w.Layout(width="60%"))
        self.card = w.HTML()
        self.plot = w.Image(format="png", layout=w.Layout(max_width="900px"))
        self.links = w.HTML()
        form = w.VBox(
            [
                w.HBox([self.config, self.engine, self.nproc]),
                w.HBox([self.zero_stage, self.steps, self.checkpoint_every, self.profile]),
                w.HBox([self.model, self.tokenizer]),
                w.HBox([self.deepspeed_config, self.grad_accum, self.precision, self.activation_checkpointing]),
            ]
        )
        self.view = w.VBox(
            [
                form,
                w.HBox([*self.buttons.values(), self.trust_run]),
                self.actions.view,
                self.message,
                self.progress,
                self.card,
                self.plot,
                self.deepspeed_view,
                self.links,
            ]
        )
        self.handle = None
        self.run: RunDir | None = None
        self.tb_server = None
        self._changed = threading.Condition()  # notified on every event: scripts and tests wait on it
        self._progress = RunProgress(1)
        self._started = time.time()
        self._png = b""
        self._plotted_at = 0.0
        self._watcher: threading.Thread | None = None
        self._set_buttons()

    # --- the form -------------------------------------------------------------------------------------------

    def settings(self) -> list[str]:
        """The form as config overrides (the same strings `--set` takes)."""
        from toolkit.train.models import model_overrides  # names only: the registry imports no torch

        settings = [
            f"engine.name={self.engine.value}",
            f"engine.nproc={self.nproc.value}",
            f"profile.enabled={str(self.profile.value).lower()}",
            *model_overrides(self.model.value),
        ]
        ds_file = self.deepspeed_config.value.strip()
        if ds_file:
            settings.append(config_mod.string_override("engine.deepspeed_config", ds_file))
        else:
            settings.append(f"engine.zero_stage={self.zero_stage.value}")
        if self.grad_accum.value > 1:
            settings.append(f"train.grad_accum_steps={self.grad_accum.value}")
        if self.precision.value:
            settings.append(f"engine.precision={self.precision.value}")
        if self.activation_checkpointing.value:
            settings.append("model.activation_checkpointing=true")
        settings += self.overrides
        if self.tokenizer.value.strip():
            settings.append(f"data.tokenizer={self.tokenizer.value.strip()}")
        if self.steps.value:
            settings += [f"train.max_steps={self.steps.value}", "train.max_seconds=0"]
        if self.checkpoint_every.value:
            settings.append(f"checkpoint.every_steps={self.checkpoint_every.value}")
        return settings

    def _set_buttons(self) -> None:
        running = self.handle is not None and self.handle.poll() is None
        state = self.run.read_status().get("state") if self.run else None
        no_run = "start or open a run first"
        self.allow(self.buttons["Start"], "a run is training: Stop or Kill it first" if running else "")
        for name in ("Stop", "Kill"):
            self.allow(self.buttons[name], "" if running else "no run is training")
        self.allow(
            self.buttons["Resume"],
            "the run is training"
            if running
            else no_run
            if self.run is None
            else f"the run is {state}: nothing left to train"
            if state not in RESUMABLE_STATES
            else "",
        )
        self.allow(self.buttons["TensorBoard"], no_run if self.run is None else "")

    # --- the toolkit calls behind the buttons -----------------------------------------------------------------

    def start(self):
        cfg = config_mod.load(self.config.value, self.settings())  # a ConfigError names the field
        self._follow(launch.start(cfg, runs_root=self.runs_root), cfg.train)
        return self.handle

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop()

    def kill(self) -> None:
        """SIGKILL every training process: what a lost node looks like (Resume continues from a checkpoint)."""
        if self.handle is not None:
            self.handle.kill()

    def resume(self):
        """What Resume does: `trainbook resume`, with --trust-run when the panel's trust box is ticked."""
        if self.run is None:
            raise ValueError(refused("run", "none yet", "start or open a run first"))
        self.wait()
        self._follow(
            launch.resume(self.run.path, trust_run=self.trust_run.value),
            self.run.read_config().train,
            keep_history=True,
        )
        return self.handle

    def tensorboard(self) -> str:
        """Start TensorBoard on this run (once) and show its link; returns the URL."""
        from toolkit.runs.tensorboard import start_tensorboard

        if self.run is None:
            raise ValueError(refused("run", "none yet", "start or open a run first"))
        if self.tb_server is None:
            self.tb_server = start_tensorboard(self.run.path)
        url = self.tb_server.url
        self.links.value = (
            f"TensorBoard: <a href='{url}' target='_blank'>{url}</a> (scalars, and the profiler's "
            "traces under PYTORCH_PROFILER)"
        )
        return url

    def close(self) -> None:
        """Stop what the panel started besides training (TensorBoard); the run itself is left alone."""
        if self.tb_server is not None:
            self.tb_server.stop()
            self.tb_server = None

    def open_run(self, run_dir: str | Path) -> TrainingPanel:
        """Show a past run's dashboard from its events.jsonl."""
        self.run, self.handle = RunDir(run_dir), None
        self.deepspeed_view.value = ""
        untrusted = self.run.untrusted_fields()
        self.trust_run.value = False
        self.trust_run.layout.display = "flex" if untrusted else "none"
        if untrusted:  # shown before anything acts on it: Resume refuses it unless the box is ticked
            from toolkit.trust import describe

            self.message.value = warn_html(
                f"not your run's settings: {describe(untrusted)}. Read its config.yaml; "
                "Resume honours them only with the trust box ticked."
            )
        train = self.run.read_config().train
        self._progress = RunProgress(train.max_steps, budget_s=train.max_seconds)
        for event in read_events(self.run):
            self._progress.apply(event)
        self._finish_progress()
        self.refresh(force_plot=True)
        return self

    # --- following a run ------------------------------------------------------------------------------------

    def _follow(self, handle, train, keep_history: bool = False) -> None:
        """Follow ``handle``'s run; ``train``: its config's train section (the step cap and the time budget)."""
        self.handle, self.run = handle, handle.run
        self.deepspeed_view.value = ""
        if not keep_history:
            self._progress, self._started = RunProgress(train.max_steps, budget_s=train.max_seconds), time.time()
        self._set_buttons()
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="trainbook-panel")
        self._watcher.start()

    def _watch(self) -> None:
        # One redraw per read of the event log, not per event: drawing (the card, the plot, the static twin) costs
        # more than a tiny step, and on a busy core a per-event redraw fell ever further behind the run.
        for batch in self.handle.follow_batches():
            if not batch:
                continue
            for event in batch:
                self._progress.apply(event)
            self.refresh()
            with self._changed:
                self._changed.notify_all()
        self._finish_progress()
        self.refresh(force_plot=True)
        with self._changed:
            self._changed.notify_all()

    def wait_until(self, predicate, timeout: float = 300.0) -> bool:
        """Block until ``predicate(progress)`` holds (e.g. ``lambda p: p.step >= 100``) or the run ends."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self._progress) or not self._watcher.is_alive(), timeout)

    def _finish_progress(self) -> None:
        status = self.run.read_status()
        if status.get("state") == "completed":
            self._progress.max_steps = self._progress.step  # a time budget completes at the step it reached
        self._progress.state = status.get("state", self._progress.state)
        self._progress.message = self._progress.message or status.get("error") or ""

    def wait(self, timeout: float | None = None) -> dict:
        """Block until the followed run ends (headless notebooks); return its status.json."""
        if self._watcher is not None:
            self._watcher.join(timeout)
        return self.run.read_status() if self.run else {}

    # --- drawing ----------------------------------------------------------------------------------------------

    def refresh(self, force_plot: bool = False) -> None:
        p = self._progress
        fraction = min(p.step / p.max_steps, 1.0) if p.max_steps else 0.0
        self.progress.value, self.progress.description = fraction, f"{100 * fraction:.0f}%"
        eta = ""
        if p.state == "running" and p.step and p.train:
            elapsed = time.time() - self._started
            eta = f" · ETA {max(elapsed / p.step * (p.max_steps - p.step), 0):,.0f} s"
        self.card.value = progress_card(
            self.run.path.name if self.run else "no run", p, self._started, run=self.run
        ) + (f"<div style='color:#666;font-size:0.8em'>{html.escape(eta)}</div>" if eta else "")
        now = time.monotonic()
        if self.run is not None and p.train and (force_plot or now - self._plotted_at >= self.plot_every_s):
            self._plotted_at = now
            self._png = plot_png(plots.training_curves, self.run.path)
            self.plot.value = self._png
        self._show_deepspeed_config()
        self._set_buttons()
        self.update_static()

    def _show_deepspeed_config(self) -> None:
        """The DeepSpeed config the run's ranks were handed (the user's file merged; written at start), once."""
        if self.run is None or self.deepspeed_view.value or not self.run.deepspeed_config_path.is_file():
            return
        from toolkit.fsio import read_regular_file

        try:  # a copied run folder is untrusted: a regular file of a sane size, never through a link
            raw = read_regular_file(
                self.run.deepspeed_config_path, field="deepspeed_config.json", error=ValueError, limit=1 << 20
            )
        except (OSError, ValueError) as exc:
            self.deepspeed_view.value = f"<div style='color:#d62728'>{html.escape(str(exc))}</div>"
            return
        text = raw.decode("utf-8", errors="replace")
        self.deepspeed_view.value = (
            "<details><summary>DeepSpeed config this run got (deepspeed_config.json: your file, \"auto\" filled, "
            f"Trainbook's fields added)</summary><pre style='font-size:0.8em'>{html.escape(text)}</pre></details>"
        )

    def static_html(self) -> str:
        """The card and the plot as plain HTML: what a notebook shows without a live kernel."""
        pct = self.progress.description
        return (
            f"<div><div style='font-size:0.8em;color:#666'>progress {pct}</div>{self.card.value}"
            f"{png_html(self._png)}{self.deepspeed_view.value}{self.actions.value}{self.message.value}</div>"
        )

    @property
    def finished(self) -> bool:
        return self.run is not None and self.run.read_status().get("state") in FINAL_STATES
