"""Pictures of a run, drawn from events.jsonl (matplotlib, Agg: works headless and in CI)."""

from __future__ import annotations

from pathlib import Path

from toolkit.rundir import RunDir


def training_curves(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Loss (train and validation, in bits per byte where the data is bytes) and throughput against step."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = RunDir(run_dir)
    train, evals = run.events("train"), run.events("eval")
    if not train:
        raise ValueError(f"run_dir: {str(run_dir)!r} has no train events yet; allowed: a run that has logged")
    in_bits = bool(evals) and "val_bpb" in evals[0]
    scale, unit = (1 / math.log(2), "bits per byte") if in_bits else (1.0, "loss (nats)")

    fig, (ax_loss, ax_speed) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax_loss.plot([e["step"] for e in train], [e["loss"] * scale for e in train], label="train", lw=1.2)
    if evals:
        ax_loss.plot([e["step"] for e in evals], [e["val_loss"] * scale for e in evals], "o-", label="validation")
        best = min(e["val_loss"] for e in evals) * scale
        ax_loss.axhline(best, color="gray", ls=":", lw=0.8)
        ax_loss.annotate(f"best {best:.3f}", (train[-1]["step"], best), ha="right", va="bottom", fontsize=8)
    ax_loss.set(xlabel="step", ylabel=unit, title="Loss")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)

    ax_speed.plot([e["step"] for e in train], [e["tokens_per_s"] for e in train], color="tab:green", lw=1.2)
    ax_speed.set(xlabel="step", ylabel="tokens/s", title="Throughput (MFU on the right)")
    ax_speed.grid(alpha=0.3)
    ax_mfu = ax_speed.twinx()
    ax_mfu.plot([e["step"] for e in train], [100 * e["mfu"] for e in train], color="tab:purple", lw=0.8, alpha=0.6)
    ax_mfu.set_ylabel("MFU %")
    fig.suptitle(run.path.name)
    fig.tight_layout()
    out = Path(out) if out else run.path / "curves.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def resume_comparison(reference_dir: str | Path, resumed_dir: str | Path, out: str | Path | None = None) -> Path:
    """The loss of an uninterrupted run, and on top of it a run that was killed and resumed.

    The resumed run's steps are drawn per attempt, so the kill point and the restart from the checkpoint are
    visible; where the resumed run is exact, its curve lies on the reference.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference, resumed = RunDir(reference_dir), RunDir(resumed_dir)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ref = reference.events("train")
    ax.plot([e["step"] for e in ref], [e["loss"] for e in ref], color="black", lw=3, alpha=0.25,
            label="uninterrupted")
    attempts, current = [[]], None
    for event in resumed.events():
        if event["event"] == "status" and event.get("state") == "running" and current is not None:
            attempts.append([])
        if event["event"] == "train":
            attempts[-1].append(event)
            current = event
    colours = ["tab:red", "tab:blue", "tab:green", "tab:purple"]
    for i, events in enumerate(a for a in attempts if a):
        label = "first attempt (killed)" if i == 0 and len(attempts) > 1 else f"after resume {i}" if i else "run"
        ax.plot([e["step"] for e in events], [e["loss"] for e in events], color=colours[i % len(colours)], lw=1.2,
                label=label)
        if i:
            ax.axvline(events[0]["step"] - 1, color=colours[i % len(colours)], ls="--", lw=0.8)
    ax.set(xlabel="step", ylabel="training loss (nats)", title="Killed, resumed from the last checkpoint")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(out) if out else resumed.path / "resume_comparison.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def loader_trials(report, out: str | Path) -> Path:
    """The loading advisor's measurements: data-wait % per DataLoader setting, against the target line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{t.num_workers} workers\nprefetch {t.prefetch_factor}" for t in report.trials]
    waits = [t.wait_pct for t in report.trials]
    colours = ["tab:green" if t is report.recommended else "tab:gray" for t in report.trials]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.bar(labels, waits, color=colours)
    ax.axhline(report.target_pct, color="tab:red", ls="--", lw=1, label=f"target {report.target_pct:g}%")
    for i, t in enumerate(report.trials):
        ax.annotate(f"{t.step_ms:.0f} ms/step", (i, waits[i]), ha="center", va="bottom", fontsize=8)
    ax.set(ylabel="data wait, % of step time", title=f"Loading advisor: {report.asset} (green: recommended)")
    ax.set_ylim(0, max(max(waits), report.target_pct) * 1.3)
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
