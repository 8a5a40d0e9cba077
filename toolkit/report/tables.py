"""Tables a notebook shows as HTML (text tables wrap badly in a notebook's output area)."""

from __future__ import annotations

import html
import json
from pathlib import Path

from toolkit.runs.rundir import OPERATORS_FILE, RunDir


def html_table(rows: list[dict], columns: dict[str, str], caption: str = "") -> str:
    """``rows`` as an HTML table; ``columns`` maps a row key to its header, in order. Cells are escaped."""
    head = "".join(f"<th>{html.escape(label)}</th>" for label in columns.values())
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(row.get(key)))}</td>" for key in columns) + "</tr>"
                   for row in rows)
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".")
    return "" if value is None else str(value)


def top_operators_html(run_dir: str | Path, rows: int = 15) -> str | None:
    """The profiler's most expensive operators of a run (its profile/top_operators.json); None when the run
    was not profiled."""
    path = RunDir(run_dir).profile_dir / OPERATORS_FILE
    if not path.is_file():
        return None
    ops = json.loads(path.read_text())[:rows]
    return html_table(ops, {"name": "operator", "self_cpu_ms": "self CPU ms", "self_cpu_pct": "self CPU %",
                            "cpu_total_ms": "CPU total ms", "calls": "calls"},
                      caption=f"top {len(ops)} operators by self time over the profiled steps")
