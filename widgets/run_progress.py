"""Live progress of a training run in a notebook: an HTML card updated in place through ``display_id``."""

from __future__ import annotations

import html
import time

from IPython.display import HTML, display

from toolkit.events import EvalEvent, TrainEvent, read_events
from toolkit.runs.progress import RunProgress
from toolkit.status import FINAL_STATES
from toolkit.train.metrics import SteadyState, steady_state
from widgets.panel import badge_html

STATE_COLOURS = {
    "queued": "#888",
    "running": "#1f77b4",
    "completed": "#2ca02c",
    "failed": "#d62728",
    "stopped": "#9467bd",
    "killed": "#ff7f0e",
}
WATCHDOG_COLOUR = "#e6a100"  # amber: the run goes on (a skipped step) or is restarted (a hang)


def render_card(
    name: str,
    state: str,
    step: int,
    max_steps: int,
    train: TrainEvent | None,
    val: EvalEvent | None,
    started: float,
    message: str = "",
    watchdog: str = "",
    recovered: str = "",
    budget_s: float = 0.0,
    estimated: bool = False,
    steady: SteadyState | None = None,
) -> str:
    """The progress card as an HTML string (pure: also used for the final, static rendering). ``message``: an
    error, in red; on a completed run it is history (an earlier attempt's end, recovered from), in grey.
    ``watchdog``: the latest watchdog notice (a skipped non-finite step, a hang), behind an amber badge.
    ``recovered``: how an earlier attempt ended, once a later one runs (RunProgress.recovered), in grey.
    ``budget_s``: the run's time budget, named beside the step count it moves (``estimated``: max_steps is the
    budget's estimate so far; before it, only the step). ``steady``: the figures a notebook's cells print for the
    finished run (toolkit.train.metrics.steady_state), shown in place of the last interval's (labelled "latest")."""
    pct = 100.0 * step / max_steps if max_steps else 0.0
    if budget_s and state not in FINAL_STATES:
        cells = [(f"step ({budget_s:g} s budget)", f"{step:,} / ~{max_steps:,}" if estimated else f"{step:,}")]
    else:
        cells = [("step", f"{step:,} / {max_steps:,}")]
    if train:
        speed, mfu, over = (
            (steady.tokens_per_s, steady.mfu, ", 2nd half") if steady else (train.tokens_per_s, train.mfu, ", latest")
        )
        cells += [
            ("loss", f"{train.loss:.4f}"),
            (f"tokens/s{over}", f"{speed:,.0f}"),
            (f"MFU{over}", f"{100 * mfu:.1f}%"),
            ("data wait", f"{train.data_wait_pct:.2f}%"),
            ("lr", f"{train.lr:.2e}"),
        ]
        if train.peak_memory_mb:  # one figure per rank: ZeRO's partitioning shows as ranks that each hold less
            cells.append(("peak memory / rank", " · ".join(f"{mb:,.0f}" for mb in train.peak_memory_mb) + " MiB"))
        if train.skipped_steps:
            cells.append(("fp16 skipped", f"{train.skipped_steps} (scale {train.loss_scale:g})"))
        if train.nonfinite_skipped:
            cells.append(("non-finite skipped", f"{train.nonfinite_skipped:,} steps"))
    if val:
        cells.append(("val loss" if val.val_bpb is None else "val bits/byte", f"{val.headline:.4f}"))
    cells.append(("elapsed", f"{time.time() - started:,.0f} s"))
    colour = STATE_COLOURS.get(state, "#888")
    row = "".join(
        f"<td style='padding:2px 10px'><div style='font-size:0.75em;color:#666'>{k}</div>"
        f"<div style='font-family:monospace'>{html.escape(v)}</div></td>"
        for k, v in cells
    )
    if message and state == "completed":
        message, recovered = "", message
    note = f"<div style='color:#d62728;margin-top:4px'>{html.escape(message)}</div>" if message else ""
    if recovered:
        said = "recovered from" if state == "completed" else "resumed after"
        earlier = f"{said} an earlier attempt's end ({recovered})"
        note += f"<div style='color:#666;margin-top:4px'>{html.escape(earlier)}</div>"
    if watchdog:
        note += (
            f"<div style='margin-top:4px'>{badge_html('watchdog', WATCHDOG_COLOUR)} "
            f"<span style='font-family:monospace;font-size:0.9em'>{html.escape(watchdog)}</span></div>"
        )
    return (
        f"<div style='border:1px solid #ddd;border-radius:6px;padding:8px;max-width:820px'>"
        f"<b>{html.escape(name)}</b> {badge_html(state, colour)}"
        f"<div style='background:#eee;border-radius:3px;height:8px;margin:6px 0'>"
        f"<div style='background:{colour};width:{pct:.1f}%;height:8px;border-radius:3px'></div></div>"
        f"<table><tr>{row}</tr></table>{note}</div>"
    )


def progress_card(
    name: str, p: RunProgress, started: float, state: str | None = None, message: str | None = None, run=None
) -> str:
    """The card of a run as ``p`` has folded its events (``state``, ``message``: the final status's, at the end).
    Once the run has ended, the speed is its steady state, read from ``run``'s events (a RunDir): kept there, not in
    ``p``, which a follower of a days-long run holds in memory."""
    state = state or p.state
    final = state in FINAL_STATES and run is not None
    return render_card(
        name,
        state,
        p.step,
        p.max_steps,
        p.train,
        p.val,
        started,
        p.message if message is None else message,
        p.watchdog,
        p.recovered,
        budget_s=p.budget_s,
        estimated=p.estimated,
        steady=steady_state(read_events(run, TrainEvent)) if final else None,
    )


def follow_run(handle, max_steps: int, show=None) -> dict:
    """Update the card until the run ends; return the run's final status.json. ``show(html)`` receives each
    card (a panel's widget); without it the card is displayed here and updated through ``display_id``."""
    started = time.time()
    progress = RunProgress(max_steps, budget_s=handle.run.read_config().train.max_seconds)

    def card_html(state=None, message=None) -> str:
        return progress_card(handle.path.name, progress, started, state, message, handle.run)

    if show is None:
        card = display(HTML(card_html()), display_id=True)
        show = lambda text: card.update(HTML(text))  # noqa: E731
    for batch in handle.follow_batches():  # one redraw per read, so the card keeps up with a fast run
        for event in batch:
            progress.apply(event)
        if batch:
            show(card_html())
    status = handle.run.read_status()
    if status.get("state") == "completed":
        progress.max_steps = progress.step  # a run stopped by its time budget is complete at the step it reached
    show(card_html(status.get("state"), progress.message or (status.get("error") or "")))
    return status
