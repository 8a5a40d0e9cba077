"""Tables a notebook shows as HTML (text tables wrap badly in a notebook's output area)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from toolkit.rundir import OPERATORS_FILE, RunDir
from toolkit.tables import Column, html_table


def top_operators_html(run_dir: str | Path, rows: int = 15) -> str | None:
    """The profiler's most expensive operators of a run (its profile/top_operators.json); None when the run
    was not profiled."""
    path = RunDir(run_dir).profile_dir / OPERATORS_FILE
    if not path.is_file():
        return None
    ops = json.loads(path.read_text())[:rows]
    return html_table(
        ops,
        [
            Column("operator", "name"),
            Column("self CPU ms", "self_cpu_ms", ",.3f", right=True),
            Column("self CPU %", "self_cpu_pct", ".1f", right=True),
            Column("CPU total ms", "cpu_total_ms", ",.3f", right=True),
            Column("calls", "calls", ",", right=True),
        ],
        caption=f"top {len(ops)} operators by self time over the profiled steps",
    )


def fine_tune_rows(runs: dict[str, str | Path]) -> list[dict]:
    """One row per run (``{label: run_dir}``) of what a fine-tune costs and buys: trainable parameters, training
    time, tokens/s, rank 0's peak memory, the newest checkpoint's size, and validation bits per byte before the
    first step (train.eval_at_start) and at the end."""
    from toolkit.checkpoint.store import CheckpointStore
    from toolkit.events import EvalEvent, StatusEvent, TrainEvent, read_events
    from toolkit.train.metrics import steady_state

    rows = []
    for label, path in runs.items():
        run = RunDir(path)
        events = read_events(run)
        statuses = [e for e in events if isinstance(e, StatusEvent)]
        evals = [e for e in events if isinstance(e, EvalEvent)]
        running = next((s for s in statuses if s.state == "running"), None)
        final = statuses[-1]
        speed = steady_state([e for e in events if isinstance(e, TrainEvent)])
        checkpoints = [c for c in CheckpointStore(run.path).list(verify=False) if c.valid]
        rows.append(
            {
                "label": label,
                "trainable": running and running.n_trainable,
                "params": running and running.n_params,
                "seconds": final.train_seconds,
                "tokens_per_s": speed and speed.tokens_per_s,
                "peak_memory_mb": final.peak_memory_mb,
                "checkpoint_mb": checkpoints[-1].size_bytes / 2**20 if checkpoints else None,
                "bpb_before": evals[0].val_bpb if evals and evals[0].step == 0 else None,
                "bpb_after": final.val_bpb,
            }
        )
    return rows


def fine_tune_html(rows: list[dict], caption: str = "") -> str:
    """``fine_tune_rows`` as a table."""

    def number(key: str, header: str, fmt: str) -> Column:
        return Column(header, key, fmt, right=True, missing="")

    return html_table(
        rows,
        [
            Column("run", "label"),
            number("trainable", "trainable parameters", ","),
            number("params", "parameters", ","),
            number("seconds", "training s", ",.1f"),
            number("tokens_per_s", "tokens/s", ",.0f"),
            number("peak_memory_mb", "peak memory MiB", ",.1f"),
            number("checkpoint_mb", "checkpoint MiB", ",.1f"),
            number("bpb_before", "bits/byte before", ".3f"),
            number("bpb_after", "bits/byte after", ".3f"),
        ],
        caption=caption,
    )


def scaling_html(result: dict) -> str:
    """A scaling series (``trainbook scale --json``) as a table: one row per process count."""

    def pct(value):
        return f"{value:.0%}" if value is not None else ""

    rows = [
        {
            "nproc": r["nproc"],
            "batch": f"{r['nproc']} x {r['batch_per_process']} = {r['global_batch']}",
            "tokens_per_s": f"{r['tokens_per_s']:,.0f}",
            "range": f"{r['tokens_per_s_min']:,.0f} to {r['tokens_per_s_max']:,.0f}",
            "efficiency": pct(r["efficiency"]),
            "step_ms": f"{r['step_ms']:.1f}",
            "compute": pct(r["compute"]),
            "communication": pct(r["communication"]),
            "data_wait": pct(r["data_wait"]),
            "side_by_side": f"{r['side_by_side_tokens_per_s']:,.0f} ({pct(r['side_by_side_efficiency'])})"
            if r.get("side_by_side_tokens_per_s")
            else "",
        }
        for r in result["runs"]
    ]
    headers = {
        "nproc": "processes",
        "batch": "global batch",
        "tokens_per_s": "tokens/s",
        "range": "range",
        "efficiency": "efficiency vs linear",
        "step_ms": "step ms",
        "compute": "compute",
        "communication": "communication",
        "data_wait": "data wait",
    }
    if any(r["side_by_side"] for r in rows):
        headers["side_by_side"] = "side by side: tokens/s (efficiency)"
    texts = ("batch", "range", "side_by_side")
    columns = [Column(header, key, right=key not in texts) for key, header in headers.items()]
    from toolkit.runs.scaling import above_linear_note

    runs = result["runs"]
    note = above_linear_note([r["efficiency"] for r in runs] + [r.get("side_by_side_efficiency") for r in runs])
    return html_table(
        rows,
        columns,
        caption=f"{result['config']}, {result['engine']}, {result['mode']} scaling, "
        f"{result['measured_steps']} measured steps per run",
    ) + (f"<div style='color:#666;font-size:0.9em'>{html.escape(note)}</div>" if note else "")
