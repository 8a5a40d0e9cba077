"""The resources step in a notebook: the doctor's table, a memory estimator with sliders, Azure ML's status.

The doctor table is HTML updated through ``display_id`` as each check lands; the two panels have a live view
and a static twin (see widgets/panel.py), so a papermill-executed notebook keeps the final state of all three.
"""

from __future__ import annotations

import html
import time
from pathlib import Path

import ipywidgets as w
from IPython.display import HTML, display

from toolkit.resources.doctor import CHECKS, Check, run_doctor, status_counts
from toolkit.tables import Column, Markup, html_table
from widgets.panel import Panel, badge_html, hint_html, plot_png, png_html, pre_html

STATUS_COLOURS = {"pass": "#2ca02c", "warn": "#ff7f0e", "fail": "#d62728", "running": "#1f77b4", "waiting": "#aaa"}


def _badge(status: str) -> str:
    return badge_html(status.upper(), STATUS_COLOURS[status])


def doctor_table_html(checks: list[Check], pending: list[str] = (), title: str = "Machine health") -> str:
    """Done checks with their colours, then the pending ones (the first of them running)."""
    rows = [
        {
            "check": c.name,
            "status": c.status,
            "required": c.required,
            "seconds": c.seconds,
            "reason": html.escape(c.summary),
        }
        for c in checks
    ]
    rows += [
        {
            "check": name,
            "status": "running" if i == 0 else "waiting",
            "required": CHECKS[name].required,
            "reason": f"<span style='color:#888'>{html.escape(CHECKS[name].about)}</span>",
        }
        for i, name in enumerate(pending)
    ]
    counts = status_counts(checks)
    failed_required = any(c.status == "fail" and c.required for c in checks)
    verdict = (
        "running..."
        if pending
        else "<b style='color:#d62728'>a required check failed</b>"
        if failed_required
        else "<b style='color:#2ca02c'>all required checks pass</b>"
    )
    tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return (
        f"<div style='max-width:980px'><b>{html.escape(title)}</b> &middot; {verdict} ({tally})"
        + html_table(
            rows,
            [
                Column("check", lambda r: Markup(f"<code>{html.escape(r['check'])}</code>")),
                Column("status", lambda r: Markup(_badge(r["status"]))),
                Column("", lambda r: "required" if r["required"] else ""),
                Column("time", lambda r: f"{r['seconds']:.1f} s" if "seconds" in r else "", right=True),
                Column("reason", lambda r: Markup(r["reason"])),
            ],
            empty=None,
            attrs="style='border-collapse:collapse;margin-top:4px'",
        )
        + "</div>"
    )


def show_doctor(**kwargs):
    """Run :func:`toolkit.resources.doctor.run_doctor` and show its table, updated as each check finishes."""
    only, skip = kwargs.get("only"), kwargs.get("skip")
    pending = [n for n in CHECKS if (not only or n in only) and not (skip and n in skip)]
    done: list[Check] = []
    table = display(HTML(doctor_table_html(done, pending)), display_id=True)

    def on_check(check: Check) -> None:
        done.append(check)
        pending.remove(check.name)
        table.update(HTML(doctor_table_html(done, pending)))

    return run_doctor(on_check=on_check, **kwargs)


# --- memory ----------------------------------------------------------------------------------------------------

MODEL_SIZES = ("125M", "350M", "1.3B", "2.7B", "7B", "13B", "30B", "70B", "175B")
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TENSOR_PARALLEL = (1, 2, 4, 8)  # within one node of 8 GPUs, where a split's all-reduces belong
PIPELINE_PARALLEL = (1, 2, 4, 8, 16, 32)  # across nodes: the guide's 175B run used 16 stages
GPU_MEMORY_GIB = (16, 24, 40, 48, 80, 94, 141, 192)


RECOMMENDED = -1  # the stage buttons' "recommended": the stage recommend_stage picks


class MemoryPanel(Panel):
    """Sliders for model size, precision, ZeRO stage, GPUs, tensor and pipeline parallelism and GPU memory; the
    estimate follows every move.

    All arithmetic is :mod:`toolkit.resources.zero_stages`'s and :mod:`toolkit.resources.memory_model`'s; the panel
    shows the chosen stage's formula, whether it fits, the stage the toolkit recommends, and the bars for every stage.
    "Write this setting" writes the recommendation as a config that trains (write_recommended_config); given a run
    directory, the panel puts the run's measured peak per rank next to the prediction for its config (compare_run)."""

    field_labels = {
        "--write-config": "config file",
        "run_dir": "run dir",
        "tensor_parallel": "split over",
        "pipeline_parallel": "stages",
    }

    def __init__(
        self,
        model_size: str = "7B",
        precision: str = "bf16",
        zero_stage: int | None = None,
        gpus: int = 8,
        gpu_memory_gib: float = 80,
        run_dir: str | Path | None = None,
        write_to: str | Path = "recommended.yaml",
        tensor_parallel: int = 1,
        pipeline_parallel: int = 1,
    ):
        from toolkit.resources.zero_stages import BYTES_PER_PARAM, STAGES, parse_count

        super().__init__()
        parse_count(model_size)  # a bad size is refused here, naming the field
        sizes = sorted({*MODEL_SIZES, model_size}, key=parse_count)
        slider = {"continuous_update": False, "layout": w.Layout(width="480px")}
        self.model_size = w.SelectionSlider(options=sizes, value=model_size, description="parameters", **slider)
        self.gpus = w.SelectionSlider(options=sorted({*GPU_COUNTS, gpus}), value=gpus, description="GPUs", **slider)
        # GPUs each layer is split over (engine.tensor_parallel); ZeRO partitions over the replicas that remain
        self.tensor_parallel = w.SelectionSlider(
            options=sorted({*TENSOR_PARALLEL, tensor_parallel}),
            value=tensor_parallel,
            description="split over",
            **slider,
        )
        # pipeline stages, each holding its share of the layers (engine.pipeline_parallel)
        self.pipeline_parallel = w.SelectionSlider(
            options=sorted({*PIPELINE_PARALLEL, pipeline_parallel}),
            value=pipeline_parallel,
            description="stages",
            **slider,
        )
        self.gpu_memory = w.SelectionSlider(
            options=sorted({*GPU_MEMORY_GIB, gpu_memory_gib}), value=gpu_memory_gib, description="GiB / GPU", **slider
        )
        self.precision = w.ToggleButtons(options=list(BYTES_PER_PARAM), value=precision, description="precision")
        # RECOMMENDED follows the recommendation; a number pins the stage shown in the headline. Not None: a
        # ToggleButtons whose value is None has no button selected, and the headline's stage would show unlit.
        self.zero_stage = w.ToggleButtons(
            options=[("recommended", RECOMMENDED)] + [(f"ZeRO-{s}", s) for s in STAGES],
            value=RECOMMENDED if zero_stage is None else zero_stage,
            description="stage",
        )
        self.headline, self.formula = w.HTML(), w.HTML()
        self.plot = w.Image(format="png", layout=w.Layout(max_width="820px"))
        self._png = b""
        controls = (
            self.model_size,
            self.gpus,
            self.tensor_parallel,
            self.pipeline_parallel,
            self.gpu_memory,
            self.precision,
            self.zero_stage,
        )
        for control in controls:
            control.observe(lambda _: self.guarded(self.refresh), names="value")
        self.write_path = w.Text(value=str(write_to), description="config file", layout=w.Layout(width="480px"))
        self.write_button = self.button(
            "Write this setting",
            self.write_setting,
            style="primary",
            tooltip="the recommended stage, GPUs and precision as a config that trains",
        )
        self.written = self.outcome_of(self.write_button)  # the file written, or why not
        self.run_dir = w.Text(value=str(run_dir or ""), description="run dir", layout=w.Layout(width="480px"))
        self.compare_button = self.button(
            "Compare with this run", self.compare, tooltip="the run's measured peak per rank next to the prediction"
        )
        self.measured = self.outcome_of(self.compare_button)  # the comparison, or why not
        self.view = w.VBox(
            [
                *controls,
                self.headline,
                self.formula,
                self.plot,
                self.message,  # the sliders' own errors
                w.HBox([self.write_path, self.write_button]),
                self.written.view,
                w.HBox([self.run_dir, self.compare_button]),
                self.measured.view,
            ]
        )
        self.advice = self.comparison = None
        self.refresh()
        if run_dir is not None:
            self.guarded(self.compare, self.measured)

    def refresh(self):
        from toolkit.report import plots
        from toolkit.resources.zero_stages import STATE_SHARE, parse_count, recommend_stage

        size = self.model_size.value
        self.advice = advice = recommend_stage(
            parse_count(size),
            self.gpu_memory.value,
            self.gpus.value,
            self.precision.value,
            self.tensor_parallel.value,
            self.pipeline_parallel.value,
        )
        stage = advice.stage if self.zero_stage.value == RECOMMENDED else self.zero_stage.value
        chosen = advice.estimates[stage if stage is not None else -1]
        budget = STATE_SHARE * self.gpu_memory.value
        fits = chosen.total_gib <= budget
        verdict = (
            f"<b style='color:#2ca02c'>fits</b> in {STATE_SHARE:.0%} of {self.gpu_memory.value:g} GiB"
            if fits
            else f"<b style='color:#d62728'>does not fit</b> in {STATE_SHARE:.0%} of "
            f"{self.gpu_memory.value:g} GiB ({budget:.1f} GiB)"
        )
        use = f"ZeRO-{advice.stage}" if advice.stage is not None else "no stage fits: more GPUs or offload"
        self.headline.value = (
            f"<div style='font-size:1.1em'>{size} parameters, {self.precision.value}, "
            f"ZeRO-{chosen.zero_stage} on {self.gpus.value} "
            f"GPU{'s' if self.gpus.value > 1 else ''}"
            + (f", each layer split over {self.tensor_parallel.value}" if self.tensor_parallel.value > 1 else "")
            + (f", in {self.pipeline_parallel.value} pipeline stages" if self.pipeline_parallel.value > 1 else "")
            + ": "
            f"<b>{chosen.total_gib:,.1f} GiB</b> of model state per GPU, {verdict}. "
            f"Recommended: <b>{html.escape(use)}</b></div>"
        )
        self.formula.value = pre_html(advice.summary())
        self._png = plot_png(plots.memory_by_stage, {size: advice})
        self.plot.value = self._png
        return advice

    def write_setting(self):
        """Write the recommended setting for the sliders' model, GPUs and precision; returns the WrittenConfig."""
        from toolkit.azure.recommended_config import write_recommended_config
        from toolkit.resources.zero_stages import parse_count

        written = write_recommended_config(
            self.write_path.value,
            params=parse_count(self.model_size.value),
            gpus=self.gpus.value,
            gpu_memory_gib=self.gpu_memory.value,
            precision=self.precision.value,
        )
        self.written.say(pre_html(written.summary()))
        return written

    def compare(self):
        """The run in the run-dir field: measured peak per rank against the prediction; returns the RunComparison."""
        from toolkit.errors import refused
        from toolkit.resources.memory_model import TOLERANCE, compare_run

        if not self.run_dir.value.strip():
            raise ValueError(refused("run dir", "is empty", "a run directory (runs/NAME-TIME)"))
        self.comparison = comparison = compare_run(self.run_dir.value.strip())
        self.measured.say(
            f"<b>{html.escape(comparison.prediction.describe())}</b>: measured peak per rank "
            f"(step {comparison.step}) against predicted, stated accuracy ±{TOLERANCE:.0%}"
            + html_table(comparison.rows())
            + pre_html(comparison.prediction.table())
        )
        return comparison

    def static_html(self) -> str:
        return (
            f"<div>{self.headline.value}{self.formula.value}{png_html(self._png, 820)}{self.written.value}"
            f"{self.measured.value}{self.message.value}</div>"
        )


# --- Azure ML ----------------------------------------------------------------------------------------------------


class AzureStatusPanel(Panel):
    """Is Azure ML reachable from here? The workspace (masked) and the credential check, with a retry button."""

    def __init__(self, config: str | Path | None = None, config_field: str = "config"):
        """``config_field``: what the person set ``config`` through (a notebook's parameter), named in messages."""
        super().__init__()
        self.config, self.config_field = config, config_field
        self.status_html = w.HTML()
        self.check_button = self.button("Check again", self.check, tooltip="look for config.json and a login again")
        self.view = w.VBox([self.status_html, self.check_button, self.outcome_of(self.check_button).view])
        self.status = None

    def check(self):
        """Look for the workspace config and a credential (a few seconds at most); returns the status."""
        from toolkit.azure.connection import connection_status

        self.status = status = connection_status(self.config, config_field=self.config_field)
        badge = badge_html("CONNECTED", "#2ca02c") if status.connected else badge_html("OFFLINE", "#ff7f0e")
        where = html.escape(status.workspace.describe()) if status.workspace else "no workspace config found"
        self.status_html.value = (
            f"<div><b>Azure ML</b> {badge} {where}<div style='color:#555'>{html.escape(status.reason)}</div></div>"
        )
        # said even when nothing changed: a check that finds the same answer still shows it looked again
        self.outcome_of(self.check_button).say(
            hint_html(f"checked at {time.strftime('%H:%M:%S')}: {'connected' if status.connected else 'offline'}")
        )
        self.update_static()
        return status

    def static_html(self) -> str:
        return self.status_html.value + self.outcome_of(self.check_button).value


class ForecastPanel(Panel):
    """A full run's time, cost and failures before the cluster is booked (toolkit.azure.forecast): a model size, a
    token budget, the Azure sizes and node counts to compare, and the MFU to assume; "Forecast" shows the table,
    where each input came from, and days against cost."""

    field_labels = {
        "--params": "parameters",
        "--tokens": "tokens",
        "--nodes": "nodes",
        "--mfu": "MFU",
        "--sku": "sizes",
    }

    def __init__(
        self,
        params: str = "1.3B",
        tokens: str = "",
        sizes: tuple[str, ...] = ("Standard_NC96ads_A100_v4", "Standard_ND96isr_H100_v5"),
        nodes: str = "1,2,4",
        mfu: str = "azure",
    ):
        from toolkit.azure.forecast import training_sizes

        super().__init__()
        wide = w.Layout(width="480px")
        self.params = w.Text(value=params, description="parameters", layout=wide)
        self.tokens = w.Text(value=tokens, description="tokens", placeholder="empty: 20 a parameter", layout=wide)
        self.sizes = w.SelectMultiple(
            options=[sku.name for sku in training_sizes()], value=tuple(sizes), description="sizes", rows=6, layout=wide
        )
        self.nodes = w.Text(value=nodes, description="nodes", layout=wide)
        self.mfu = w.Text(value=mfu, description="MFU", placeholder="azure, 0.4, run:RUN_DIR", layout=wide)
        self.forecast_button = self.button("Forecast", self.refresh, style="primary", tooltip="time, cost, failures")
        self.table, self.sources = w.HTML(), w.HTML()
        self.plot = w.Image(format="png", layout=w.Layout(max_width="720px"))
        self._png = b""
        self.report = None
        self.view = w.VBox(
            [
                self.params,
                self.tokens,
                self.sizes,
                self.nodes,
                self.mfu,
                w.HBox([self.forecast_button, self.outcome_of(self.forecast_button).view]),
                self.table,
                self.sources,
                self.plot,
                self.message,
            ]
        )
        self.guarded(self.refresh, self.outcome_of(self.forecast_button))

    def refresh(self):
        """Forecast the form's model on its sizes and node counts; returns the ForecastReport."""
        from toolkit.azure.errors import AzureError
        from toolkit.azure.forecast import forecast_sizes, node_counts
        from toolkit.errors import not_allowed
        from toolkit.report import plots

        self.table.value = self.sources.value = ""  # a failed forecast leaves no earlier one beside its error
        self._png, self.plot.value = b"", b""
        nodes = node_counts(self.nodes.value)
        if not self.sizes.value:
            raise AzureError(not_allowed("--sku", "", "at least one size"))
        self.report = report = forecast_sizes(
            self.params.value.strip(),
            list(self.sizes.value),
            nodes,
            tokens=self.tokens.value.strip() or None,
            mfu=self.mfu.value.strip(),
        )
        self.table.value = report.table(html=True)
        self.sources.value = pre_html("\n".join(report.sources()))
        self._png = plot_png(plots.forecast_plot, [row.to_dict() for row in report.rows])
        self.plot.value = self._png
        return report

    def static_html(self) -> str:
        return f"<div>{self.table.value}{self.sources.value}{png_html(self._png, 720)}{self.message.value}</div>"
