"""The doctor in a notebook: a table with pass/warn/fail colours that fills in as each check lands.

The table is HTML updated through ``display_id``, so a papermill-executed notebook keeps the final table.
"""

from __future__ import annotations

import html

from IPython.display import HTML, display

from toolkit.doctor import CHECKS, Check, run_doctor, status_counts

STATUS_COLOURS = {"pass": "#2ca02c", "warn": "#ff7f0e", "fail": "#d62728", "running": "#1f77b4", "waiting": "#aaa"}


def _badge(status: str) -> str:
    return (f"<span style='background:{STATUS_COLOURS[status]};color:white;border-radius:4px;padding:1px 6px;"
            f"font-size:0.8em'>{status.upper()}</span>")


def doctor_table_html(checks: list[Check], pending: list[str] = (), title: str = "Machine health") -> str:
    """Done checks with their colours, then the pending ones (the first of them running)."""
    rows = []
    for c in checks:
        rows.append(f"<tr><td><code>{html.escape(c.name)}</code></td><td>{_badge(c.status)}</td>"
                    f"<td>{'required' if c.required else ''}</td><td style='text-align:right'>{c.seconds:.1f} s</td>"
                    f"<td style='text-align:left'>{html.escape(c.summary)}</td></tr>")
    for i, name in enumerate(pending):
        state = "running" if i == 0 else "waiting"
        rows.append(f"<tr><td><code>{html.escape(name)}</code></td><td>{_badge(state)}</td>"
                    f"<td>{'required' if CHECKS[name].required else ''}</td><td></td>"
                    f"<td style='text-align:left;color:#888'>{html.escape(CHECKS[name].about)}</td></tr>")
    counts = status_counts(checks)
    failed_required = any(c.status == "fail" and c.required for c in checks)
    verdict = ("running..." if pending else
               "<b style='color:#d62728'>a required check failed</b>" if failed_required else
               "<b style='color:#2ca02c'>all required checks pass</b>")
    tally = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    return (f"<div style='max-width:980px'><b>{html.escape(title)}</b> &middot; {verdict} ({tally})"
            "<table style='border-collapse:collapse;margin-top:4px'><tr><th>check</th><th>status</th><th></th>"
            f"<th>time</th><th style='text-align:left'>reason</th></tr>{''.join(rows)}</table></div>")


def show_doctor(**kwargs):
    """Run :func:`toolkit.doctor.run_doctor` and show its table, updated as each check finishes."""
    only, skip = kwargs.get("only"), kwargs.get("skip")
    pending = [n for n in CHECKS if (not only or n in only) and not (skip and n in skip)]
    done: list[Check] = []
    table = display(HTML(doctor_table_html(done, pending)), display_id=True)

    def on_check(check: Check) -> None:
        done.append(check)
        pending.remove(check.name)
        table.update(HTML(doctor_table_html(done, pending)))

    return run_doctor(on_check=on_check, **kwargs)
