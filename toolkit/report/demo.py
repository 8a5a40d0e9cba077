"""``make demo``: execute every guided notebook headlessly with papermill, then print the figures.

Executed copies go to outputs/ (ignored by git) as .ipynb and .html, runs to outputs/runs/. A failing notebook
is reported (with the cell that failed; its partial output is still written) and the demo goes on with the
next, then exits non-zero. The summary: time and status per notebook, this demo's runs, and the key figures
the notebooks recorded (toolkit.report.figures).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from toolkit.report import figures
from toolkit.paths import PROJECT_ROOT
from toolkit.events import StatusEvent, TrainEvent, read_events
from toolkit.rundir import RunDir
from toolkit.train.metrics import steady_state
from toolkit.tables import Column, text_table

NOTEBOOKS = PROJECT_ROOT / "notebooks"
OUTPUTS = PROJECT_ROOT / "outputs"


def guided_notebooks() -> list[Path]:
    """The course notebooks in order: 00_*.ipynb, 01_*.ipynb, ..., a side trip such as 03b_*.ipynb after its 03."""
    return sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb"))


def execute(notebook: Path, out_dir: Path, parameters: dict) -> Path:
    """Run ``notebook`` with papermill into ``out_dir``; parameters it does not declare are left out (papermill
    would inject them anyway, with a warning), so the demo can offer every notebook the same settings."""
    import papermill

    declared = papermill.inspect_notebook(str(notebook))
    parameters = {k: v for k, v in parameters.items() if k in declared}
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / notebook.name
    papermill.execute_notebook(
        str(notebook), str(out), parameters=parameters, cwd=str(NOTEBOOKS), kernel_name="python3", progress_bar=False
    )
    return out


def run_summary(runs: Path) -> list[dict]:
    """One row per run under ``runs``: final validation figure, throughput and MFU in steady state."""
    rows = []
    for path in sorted(p for p in runs.glob("*") if (p / "status.json").exists()):
        run = RunDir(path)
        status, train = run.read_status(), read_events(run, TrainEvent)
        finals = read_events(run, StatusEvent)
        final = finals[-1] if finals else None
        speed = steady_state(train)
        rows.append(
            {
                "run": path.name,
                "state": status.get("state"),
                "steps": status.get("step"),
                "val_bpb": final and final.val_bpb,
                "val_loss": final and final.val_loss,
                "train_s": final and final.train_seconds,
                "tokens_per_s": speed and speed.tokens_per_s,
                "mfu": speed and speed.mfu,
            }
        )
    return rows


def export_html(executed: Path) -> Path:
    """The executed notebook as one HTML file beside it (outputs, pictures and static panels included)."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_filename(str(executed))
    out = executed.with_suffix(".html")
    out.write_text(body, encoding="utf-8")
    return out


FIGURES = [  # (key recorded by a notebook, label, format)
    ("doctor_ok", "doctor: required checks pass", ""),
    ("scaling_efficiency_small_batch", "scaling efficiency at 2 processes", ".0%"),
    ("scaling_efficiency_large_batch", "  with 4x the batch per process", ".0%"),
    ("side_by_side_over_distributed", "  trials side by side / distributed", ".2f"),
    ("checkpoint_lost_ms", "checkpoint cost: training lost, ms", ".2f"),
    ("checkpoint_blocking_ms", "  of which blocked, median ms", ".2f"),
    ("resume_identical", "resume check: identical losses", ""),
    ("parity_max_abs_diff", "ONNX parity, max abs diff", ".1e"),
    ("endpoint_p50_ms", "endpoint p50 latency, ms", ".1f"),
    ("endpoint_rps_16", "endpoint requests/s, 16 clients", ".1f"),
    ("lora_bpb_after", "code bits/byte after LoRA", ".3f"),
    ("full_bpb_after", "  after a full fine-tune", ".3f"),
    ("hf_endpoint_agrees", "endpoint = plain transformers", ""),
    ("chat_loss_before", "chat held-out loss before", ".3f"),
    ("chat_loss_after", "  after a LoRA chat fine-tune", ".3f"),
    ("openai_stream_agrees", "OpenAI client: streamed = whole", ""),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(OUTPUTS), help="where executed notebooks and runs go")
    parser.add_argument("--only", action="append", help="run only notebooks whose name contains this")
    args = parser.parse_args(argv)
    out_dir = Path(args.out).resolve()
    runs = out_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    os.environ["TRAINBOOK_WORKSPACE"] = str(out_dir / "workspace")  # one workspace for every notebook and run
    figures_file = out_dir / "figures.json"
    figures_file.unlink(missing_ok=True)
    os.environ[figures.ENV] = str(figures_file)
    notebooks = [nb for nb in guided_notebooks() if not args.only or any(s in nb.name for s in args.only)]
    rows, started_runs = [], {p.name for p in runs.iterdir()}
    for nb in notebooks:
        print(f"[demo] {nb.name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            # the workspace comes from TRAINBOOK_WORKSPACE; each notebook takes the settings it declares
            executed = execute(nb, out_dir, {"runs_root": str(runs), "plan_dir": str(out_dir / "azure-plan")})
            status = "ok"
        except Exception as exc:  # papermill's PapermillExecutionError names the cell and the traceback
            executed, status = out_dir / nb.name, "FAILED"
            print(f"[demo] {nb.name} FAILED: {exc}", file=sys.stderr)
        if executed.exists():
            export_html(executed)
        rows.append((nb.name, time.perf_counter() - t0, status))
        print(f"[demo] {nb.name} {status} in {rows[-1][1]:.0f} s -> {executed}", flush=True)

    print(
        "\n"
        + text_table(
            [*rows, ("total", sum(r[1] for r in rows), "")],
            [
                Column("notebook", lambda r: r[0]),
                Column("seconds", lambda r: r[1], ".0f", right=True),
                Column("status", lambda r: r[2]),
            ],
        )
    )
    run_rows = [r for r in run_summary(runs) if r["run"] not in started_runs]  # this demo's runs only
    if run_rows:
        print(
            "\n"
            + text_table(
                run_rows,
                [
                    Column("run", "run"),
                    Column("state", lambda r: r["state"] or None),
                    Column("steps", "steps", "d", right=True),
                    Column("val loss", "val_loss", ".3f", right=True),
                    Column("val bpb", "val_bpb", ".3f", right=True),
                    Column("train s", "train_s", ".0f", right=True),
                    Column("tokens/s", "tokens_per_s", ",.0f", right=True),
                    Column("MFU", lambda r: r["mfu"], ".1%", right=True),
                ],
            )
        )
    recorded = figures.read(figures_file)
    if recorded:
        print()
        for key, label, spec in FIGURES:
            if key in recorded:
                print(f"{label:<34} {format(recorded[key], spec) if spec else recorded[key]}")
    (out_dir / "summary.json").write_text(
        json.dumps({"notebooks": rows, "runs": run_rows, "figures": recorded}, indent=1)
    )
    print(f"\nexecuted notebooks (.ipynb and .html) and runs: {out_dir}")
    return 0 if all(status == "ok" for _, _, status in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
