"""A terminal progress bar fed by a run's events.jsonl (the CLI's view of a run)."""

from __future__ import annotations

import sys

from tqdm import tqdm


def follow_in_terminal(handle, max_steps: int, file=None) -> dict:
    """Show step, loss, tokens/s and ETA while the run goes; return the last status event."""
    final: dict = {}
    with tqdm(total=max_steps, unit="step", file=file or sys.stderr, dynamic_ncols=True,
              bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}] {postfix}") as bar:
        postfix: dict = {}
        for event in handle.follow():
            kind = event["event"]
            if kind == "train":
                bar.total = event.get("horizon", bar.total)  # a time budget moves the finish line
                bar.update(event["step"] - bar.n)
                postfix.update(loss=f"{event['loss']:.3f}", tok_s=f"{event['tokens_per_s']:,.0f}",
                               mfu=f"{100 * event['mfu']:.0f}%")
            elif kind == "eval":
                postfix["val"] = f"{event.get('val_bpb', event['val_loss']):.3f}"
            elif kind == "error":
                bar.write(f"error: {event['message']}")
            elif kind == "status":
                final = event
            bar.set_postfix(postfix, refresh=True)
    return final
