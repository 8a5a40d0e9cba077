"""The checkpoints panel: what a run has on disk, resuming from any valid checkpoint, and how often to save.

    panel = CheckpointsPanel(run_dir, gpus=64).show()
    panel.resume_from.value = "step_00000040"   # any valid checkpoint; newer ones are set aside, not deleted
    panel.resume(); panel.wait()                # what the Resume button does; wait() returns the final status

Listing verifies every file's checksum against the manifest (toolkit.checkpoint.store), in a background thread
when started from the button, since reading a large checkpoint takes a while. Each row shows what the
checkpoint cost when it was written: the training time it lost (its blocking plus the slowdown of the steps
its background write overlapped, toolkit.checkpoint.cost) and, of that, the time training stood still. The
interval advisor is toolkit.checkpoint.interval_advisor's Young/Daly arithmetic on the run's own lost time and step
time.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

import ipywidgets as w

from toolkit.errors import not_allowed, refused
from toolkit.runs import launch
from toolkit.checkpoint.store import SUPERSEDED_PREFIX, CheckpointStore
from toolkit.events import CheckpointEvent, read_events
from toolkit.rundir import RunDir
from widgets.panel import Panel, hint_html, ok_html, plot_png, png_html, pre_html
from toolkit.tables import html_table
from widgets.run_progress import follow_run

# Job sizes for the advisor's slider: a laptop to a frontier run (MTBF scales as 1 / GPUs).
GPU_COUNTS = (1, 8, 64, 512, 2048, 8192, 16384)


def _ms(value) -> str:
    return f"{value:,.1f}" if isinstance(value, (int, float)) else ""


class CheckpointsPanel(Panel):
    def __init__(self, run_dir: str | Path, gpus: int = 64, restart_s: float = 60.0, verify: bool = True):
        super().__init__()
        self.run = RunDir(run_dir)
        if not self.run.config_path.is_file():
            raise FileNotFoundError(
                not_allowed("run_dir", run_dir, "a run directory", problem="holds no run (no config.yaml)")
            )
        self.store = CheckpointStore(self.run.path)
        self.verify = w.Checkbox(value=verify, description="verify checksums")
        self.table = w.HTML()
        self.refresh_button = self.button("Refresh", self.refresh_in_background, tooltip="list and verify again")
        self.resume_from = w.Dropdown(description="resume from")
        self.resume_button = self.button(
            "Resume", self.resume, "primary", "continue the run from the chosen checkpoint"
        )
        self.resume_hint = w.HTML()  # why Resume is greyed out
        self.resume_from.observe(lambda _: self._allow_resume(), names="value")
        self.card = w.HTML()
        self.gpus = w.SelectionSlider(
            options=sorted({*GPU_COUNTS, gpus}),
            value=gpus,
            description="job GPUs",
            continuous_update=False,
            layout=w.Layout(width="420px"),
        )
        self.restart_s = w.BoundedFloatText(
            value=restart_s,
            min=0,
            max=86400,
            description="restart s",
            tooltip="seconds from a failure to training again (scheduling, loading)",
        )
        for control in (self.gpus, self.restart_s):
            control.observe(lambda _: self.guarded(self.advise), names="value")
        self.advice_text = w.HTML()
        self.advice_plot = w.Image(format="png", layout=w.Layout(max_width="760px"))
        self._advice_png = b""
        self.infos = []
        self.advice = None
        self.handle = None
        self.view = w.VBox(
            [
                w.HTML(f"<b>Checkpoints of {html.escape(self.run.path.name)}</b>"),
                self.table,
                w.HBox([self.verify, self.refresh_button]),
                self.outcome_of(self.refresh_button).view,
                w.HBox([self.resume_from, self.resume_button, self.resume_hint]),
                self.outcome_of(self.resume_button).view,
                self.card,
                w.HTML("<b>Interval advisor</b> (Young/Daly: T = sqrt(2 C M) - C)"),
                w.HBox([self.gpus, self.restart_s]),
                self.message,
                self.advice_text,
                self.advice_plot,
            ]
        )
        self.refresh()
        self.guarded(self.advise)

    # --- what is on disk ------------------------------------------------------------------------------------------

    def refresh(self) -> list:
        self.infos = self.store.list(verify=self.verify.value)
        latest = self.store.latest_name()
        cost = {e.step: e for e in read_events(self.run, CheckpointEvent)}  # a resumed run's later write wins
        rows = [
            {
                "checkpoint": i.name + ("  <- LATEST" if i.name == latest else ""),
                "step": "" if i.step is None else i.step,
                "valid": "yes" if i.valid else "set aside" if i.name.startswith(SUPERSEDED_PREFIX) else "NO",
                "MB": f"{i.size_bytes / 2**20:,.2f}",
                "training lost ms": _ms(cost[i.step].lost_ms if i.step in cost else None),
                "of which blocked": _ms(cost[i.step].blocking_ms if i.step in cost else None),
                "written": time.strftime("%H:%M:%S", time.localtime(i.created)) if i.created else "",
                "why": i.reason,
            }
            for i in self.infos
        ]
        self.table.value = html_table(
            rows,
            empty="no checkpoints yet (set checkpoint.every_steps)",
            highlight=lambda r: {"NO": "#fde0dd", "set aside": "#f3f3f3"}.get(r["valid"]),
        ) + (
            "<small>A checkpoint's cost is the <b>training time lost</b>: the time training stood still (blocked) "
            "plus the slowdown of the steps its background write overlapped.</small>"
            if rows
            else ""
        )
        valid = [i.name for i in self.infos if i.valid]
        self.resume_from.options = [(f"{n} (LATEST)" if n == latest else n, n) for n in valid]
        self.resume_from.value = latest if latest in valid else (valid[-1] if valid else None)
        self._allow_resume()
        self.update_static()
        return self.infos

    def _allow_resume(self) -> None:
        """Resume is for a run that stopped short (killed, failed, stopped) and has a checkpoint; while it trains
        again, it is greyed out: a second click cannot queue a second resume."""
        state = self.run.read_status().get("state")
        running = self.handle is not None and self.handle.poll() is None
        why = (
            "training again: wait for it to end"
            if running
            else "no valid checkpoint to resume from"
            if self.resume_from.value is None
            else f"the run is {state}: nothing left to train (pick an older checkpoint to roll back)"
            if state == "completed" and self.resume_from.value == self.store.latest_name()
            else ""
        )
        self.allow(self.resume_button, why)
        self.resume_hint.value = hint_html(why) if why and not running else ""

    def refresh_in_background(self) -> None:
        self.in_background(
            "verifying checkpoints", self.refresh, [self.refresh_button], self.outcome_of(self.refresh_button)
        )

    # --- resuming -------------------------------------------------------------------------------------------------

    def resume(self):
        """Resume from the chosen checkpoint (LATEST: a plain resume; an older one: roll back to it), and follow
        the run in the background until it ends."""
        chosen, latest = self.resume_from.value, self.store.latest_name()
        if chosen is None:
            raise ValueError(refused("resume from", "no valid checkpoint", "a run that saved at least one"))
        self.handle = handle = launch.resume(self.run.path, from_checkpoint=None if chosen == latest else chosen)
        resumed = f"resumed from {chosen}" + (
            "" if chosen == latest else " (newer checkpoints set aside as superseded-*)"
        )

        def follow():
            status = follow_run(
                handle, self.run.read_config().train.max_steps, show=lambda text: setattr(self.card, "value", text)
            )
            self.refresh()
            self.advise()
            self.outcome_of(self.resume_button).say(
                ok_html(f"{resumed}: {status.get('state')} at step {status.get('step')}")
            )
            return status

        self.in_background(
            resumed + ", training",
            follow,
            [self.resume_button, self.refresh_button],
            self.outcome_of(self.resume_button),
        )
        return handle

    def after_task(self) -> None:
        self._allow_resume()

    # --- how often ------------------------------------------------------------------------------------------------

    def advise(self):
        from toolkit.report import plots
        from toolkit.checkpoint.interval_advisor import advise_for_run, mtbf_for_gpus

        self.advice = advice = advise_for_run(
            self.run.path, mtbf_s=mtbf_for_gpus(self.gpus.value), restart_s=self.restart_s.value
        )
        every = self.run.read_config().checkpoint.every_steps
        current_s = every * advice.step_time_s if every and advice.step_time_s else None
        self.advice_text.value = pre_html(advice.summary())
        self._advice_png = plot_png(plots.checkpoint_interval, advice, current_s=current_s)
        self.advice_plot.value = self._advice_png
        self.update_static()
        return advice

    def static_html(self) -> str:
        return (
            f"<div><b>Checkpoints of {html.escape(self.run.path.name)}</b>{self.table.value}"
            f"{self.outcome_of(self.refresh_button).value}{self.resume_hint.value}"
            f"{self.outcome_of(self.resume_button).value}"
            f"{self.card.value}{self.message.value}{self.advice_text.value}{png_html(self._advice_png, 760)}</div>"
        )
