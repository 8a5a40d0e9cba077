"""Pictures of a run, drawn from events.jsonl (matplotlib, Agg: works headless and in CI)."""

from __future__ import annotations

import math
from pathlib import Path

from toolkit.errors import RefusedValue, not_allowed
from toolkit.events import CheckpointEvent, EvalEvent, StatusEvent, TrainEvent, read_events
from toolkit.rundir import RunDir


def _pyplot():
    """matplotlib's pyplot on the Agg backend: pictures are files, so it works headless, in CI and in kernels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# What a picture may be saved as: the formats matplotlib's Agg canvas writes that people open
PICTURE_FORMATS = ("png", "svg", "pdf", "jpg", "jpeg", "webp")


def picture_path(out: str | Path, field: str) -> Path:
    """``out`` as a picture's path, refused naming ``field`` unless its extension is one of PICTURE_FORMATS (checked
    before anything is drawn)."""
    out = Path(out)
    if out.suffix.lower().removeprefix(".") not in PICTURE_FORMATS:
        raise RefusedValue(
            not_allowed(
                field,
                str(out),
                f"a path ending in .{', .'.join(PICTURE_FORMATS)}",
                problem="is not a picture format matplotlib writes",
            )
        )
    return out


def _save(fig, out: str | Path) -> Path:
    out = picture_path(out, "out")
    out.parent.mkdir(parents=True, exist_ok=True)  # e.g. notebook 01's pictures folder, made by no earlier cell
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    _pyplot().close(fig)
    return out


def loss_scale(evals, statuses=()) -> tuple[float, str]:
    """(factor, unit) that turn a loss in nats per token into what a run's card shows: bits per byte where the data
    is text, the loss in nats otherwise. The factor is the data's own, 1 / (ln 2 x bytes per token): from the run's
    start (StatusEvent.bytes_per_token), so a live plot is in bits per byte from its first point, or else read off
    an evaluation (val_bpb / val_loss). For a byte-level model it is 1 / ln 2, for a BPE tokenizer smaller: bits per
    token are never drawn as bits per byte."""
    started = next((s for s in statuses if s.bytes_per_token), None)
    if started is not None:
        return 1 / (math.log(2) * started.bytes_per_token), "bits per byte"
    first = next((e for e in evals if e.val_bpb is not None and e.val_loss > 0), None)
    return (first.val_bpb / first.val_loss, "bits per byte") if first else (1.0, "loss (nats)")


def training_curves(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Loss (train and validation, in bits per byte where the data is text) and throughput against step."""
    plt = _pyplot()

    run = RunDir(run_dir)
    train, evals = read_events(run, TrainEvent), read_events(run, EvalEvent)
    if not train:
        raise RefusedValue(not_allowed("run_dir", run_dir, "a run that has logged", problem="has no train events yet"))
    scale, unit = loss_scale(evals, read_events(run, StatusEvent))

    fig, (ax_loss, ax_speed) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax_loss.plot([e.step for e in train], [e.loss * scale for e in train], label="train", lw=1.2)
    if evals:
        ax_loss.plot([e.step for e in evals], [e.val_loss * scale for e in evals], "o-", label="validation")
        best = min(e.val_loss for e in evals) * scale
        ax_loss.axhline(best, color="gray", ls=":", lw=0.8)
        ax_loss.annotate(f"best {best:.3f}", (train[-1].step, best), ha="right", va="bottom", fontsize=8)
    for i, ckpt in enumerate(read_events(run, CheckpointEvent)):  # where a resume would restart from
        ax_loss.axvline(ckpt.step, color="tab:green", lw=0.8, alpha=0.5, label="checkpoint" if i == 0 else None)
    ax_loss.set(xlabel="step", ylabel=unit, title="Loss")
    ax_loss.legend()
    ax_loss.grid(alpha=0.3)

    ax_speed.plot([e.step for e in train], [e.tokens_per_s for e in train], color="tab:green", lw=1.2)
    ax_speed.set(xlabel="step", ylabel="tokens/s", title="Throughput (MFU on the right)")
    ax_speed.grid(alpha=0.3)
    ax_mfu = ax_speed.twinx()
    ax_mfu.plot([e.step for e in train], [100 * e.mfu for e in train], color="tab:purple", lw=0.8, alpha=0.6)
    ax_mfu.set_ylabel("MFU %")
    fig.suptitle(run.path.name)
    return _save(fig, out or run.path / "curves.png")


def resume_comparison(reference_dir: str | Path, resumed_dir: str | Path, out: str | Path | None = None) -> Path:
    """The loss of an uninterrupted run, and on top of it a run that was killed and resumed.

    The resumed run's steps are drawn per attempt, so the kill point and the restart from the checkpoint are
    visible; where the resumed run is exact, its curve lies on the reference.
    """
    plt = _pyplot()

    reference, resumed = RunDir(reference_dir), RunDir(resumed_dir)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ref = read_events(reference, TrainEvent)
    # The reference as a line, the resumed run as markers: where the resumed run is exact its markers sit on the
    # line, and neither hides the other (two lines of the same values would draw as one).
    ax.plot([e.step for e in ref], [e.loss for e in ref], color="black", lw=1.2, label="uninterrupted (line)")
    # each attempt's train events, with the checkpoint step it resumed from (None for the first)
    attempts: list[tuple[list[TrainEvent], int | None]] = [([], None)]
    current = None
    for event in read_events(resumed):
        if isinstance(event, StatusEvent) and event.state == "running" and current is not None:
            attempts.append(([], event.resumed_step))
        if isinstance(event, TrainEvent):
            attempts[-1][0].append(event)
            current = event
    colours = ["tab:red", "tab:blue", "tab:green", "tab:purple"]
    for i, (events, start) in enumerate(a for a in attempts if a[0]):
        label = "first attempt (killed)" if i == 0 and len(attempts) > 1 else f"after resume {i}" if i else "run"
        ax.plot(
            [e.step for e in events],
            [e.loss for e in events],
            "o" if i else "x",
            ms=4,
            mfc="none",
            color=colours[i % len(colours)],
            label=f"{label} (markers)",
        )
        if i and start is not None:  # where this attempt started: the checkpoint it loaded, not its first log line
            colour = colours[i % len(colours)]
            ax.axvline(start, color=colour, ls="--", lw=0.8, label=f"checkpoint resumed from (step {start})")
    ax.set(xlabel="step", ylabel="training loss (nats)", title="Killed, resumed from the last checkpoint")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out or resumed.path / "resume_comparison.png")


def loader_trials(report, out: str | Path) -> Path:
    """The loading advisor's measurements: data-wait % per DataLoader setting, against the target line."""
    plt = _pyplot()

    labels = [
        (
            f"{t.num_workers} worker{'s' if t.num_workers != 1 else ''}\nprefetch {t.prefetch_factor}"
            if t.num_workers
            else "no workers\n(main process)"
        )
        for t in report.trials
    ]
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
    return _save(fig, out)


def allreduce_bandwidth(sweep, out: str | Path) -> Path:
    """The doctor's all-reduce sweep: bus bandwidth against message size (log-log), as nccl-tests users read it."""
    plt = _pyplot()
    sizes = [r.size_bytes for r in sweep.rows]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    # busbw = algbw x 2(n-1)/n: at 2 processes the two are equal, so algbw is drawn as larger hollow squares
    # around busbw's dots, and the legend says why they coincide
    same = " (= bus bandwidth at 2 processes)" if sweep.nproc == 2 else ""
    ax.plot(sizes, [r.busbw_gbps for r in sweep.rows], "o-", ms=4, label="bus bandwidth")
    ax.plot(
        sizes, [r.algbw_gbps for r in sweep.rows], "s--", ms=9, mfc="none", lw=1, label=f"algorithm bandwidth{same}"
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set(
        xlabel="message size (bytes)",
        ylabel="GB/s",
        title=f"all_reduce, {sweep.nproc} processes, {sweep.backend}: latency-bound left, bandwidth-bound right",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    return _save(fig, out)


def memory_by_stage(advices: dict, out: str | Path) -> Path:
    """Model-state GiB per GPU for each model size (groups) and ZeRO stage (bars), against the GPU's budget."""
    import numpy as np

    from toolkit.resources.zero_stages import STAGES, STATE_SHARE

    plt = _pyplot()
    labels = list(advices)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(STAGES)
    for i, stage in enumerate(STAGES):
        gib = [advices[label].estimates[stage].total_gib for label in labels]
        ax.bar(np.arange(len(labels)) + (i - 1.5) * width, gib, width, label=f"ZeRO-{stage}")
    budget = STATE_SHARE * next(iter(advices.values())).gpu_memory_gib
    ax.axhline(budget, color="tab:red", ls="--", lw=1, label=f"{STATE_SHARE:.0%} of a GPU")
    ax.set_yscale("log")
    tallest = max(a.estimates[stage].total_gib for a in advices.values() for stage in STAGES)
    ax.set_ylim(top=30 * max(tallest, budget))  # on log axes: room above the tallest bar for the legend
    ax.set_xticks(
        range(len(labels)),
        [
            f"{label}\n(use ZeRO-{advices[label].stage})"
            if advices[label].stage is not None
            else f"{label}\n(does not fit)"
            for label in labels
        ],
    )
    gpus = next(iter(advices.values())).estimates[0].gpus
    ax.set(ylabel="GiB per GPU (model state)", title=f"Adam model state per GPU on {gpus} GPUs")
    ax.legend(fontsize=8, ncol=5)
    return _save(fig, out)


def checkpoint_interval(advice, out: str | Path, current_s: float | None = None) -> Path:
    """Time lost to checkpoints and failures against the checkpoint interval (log x) with C = the training time a
    checkpoint loses, the advised interval marked, and the run's own interval if given: too often wastes the
    checkpoints' cost, too rarely wastes recomputation. Where the blocking time is much smaller than the loss, a
    grey curve shows what counting only the blocking would wrongly advise."""
    import numpy as np

    from toolkit.checkpoint.interval_advisor import advise, overhead_pct

    plt = _pyplot()
    lo = max(min(advice.cost_s, advice.blocking_s or advice.cost_s), 1e-3)
    hi = max(advice.mtbf_s, 10 * advice.interval_s)
    intervals = np.geomspace(lo, hi, 200)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(
        intervals,
        [overhead_pct(t, advice.cost_s, advice.mtbf_s, advice.restart_s) for t in intervals],
        color="tab:blue",
        label=f"C = {advice.cost_s * 1e3:,.1f} ms "
        f"({'training time lost' if advice.cost_basis == 'lost' else 'blocking only'})",
    )
    ax.axvline(
        advice.interval_s,
        color="tab:green",
        lw=1.5,
        label=f"advised: every {advice.interval_s:,.0f} s ({advice.overhead_pct:.2f}% lost)",
    )
    if advice.cost_basis == "lost" and advice.blocking_s and advice.blocking_s < advice.cost_s / 2:
        naive = advise(advice.blocking_s, advice.mtbf_s, advice.persist_s, advice.restart_s)
        ax.plot(
            intervals,
            [overhead_pct(t, advice.blocking_s, advice.mtbf_s, advice.restart_s) for t in intervals],
            color="0.6",
            ls=":",
            label=f"if only the blocking ({advice.blocking_s * 1e3:,.1f} ms) counted",
        )
        real = overhead_pct(naive.interval_s, advice.cost_s, advice.mtbf_s, advice.restart_s)
        ax.axvline(
            naive.interval_s,
            color="0.6",
            ls=":",
            lw=1.2,
            label=f"its advice: every {naive.interval_s:,.0f} s (really {real:.2f}% lost)",
        )
    if current_s:
        current = overhead_pct(current_s, advice.cost_s, advice.mtbf_s, advice.restart_s)
        ax.axvline(
            current_s,
            color="tab:orange",
            ls="--",
            lw=1.5,
            label=f"this run: every {current_s:,.1f} s ({current:.2f}% lost)",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(
        xlabel="checkpoint interval (s)",
        ylabel="time lost (%)",
        title=f"Checkpoint interval at MTBF {advice.mtbf_s / 3600:,.1f} h, restart {advice.restart_s:.0f} s",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return _save(fig, out)


def latency_histogram(latencies_ms: list[float], out: str | Path, title: str = "Endpoint latency") -> Path:
    """Client-side request latencies with p50 / p95 / p99 marked."""
    import numpy as np

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.hist(latencies_ms, bins=min(30, max(5, len(latencies_ms) // 3)), color="tab:blue", alpha=0.8)
    for q, style in ((50, "-"), (95, "--"), (99, ":")):
        value = float(np.percentile(latencies_ms, q))
        ax.axvline(value, color="tab:red", ls=style, lw=1, label=f"p{q} {value:.1f} ms")
    ax.set_xlim(right=max(latencies_ms) * 1.1)  # p99 is near the slowest request: keep its line off the edge
    ax.set(xlabel="latency (ms)", ylabel="requests", title=f"{title} ({len(latencies_ms)} requests)")
    ax.legend()
    return _save(fig, out)


def compare_curves(curves: dict[str, list[tuple[float, float]]], out: str | Path, title: str) -> Path:
    """Several runs' curves on one axis: ``{label: [(step, value), ...]}``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for label, points in curves.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", ms=3, label=label)
    ax.set(xlabel="step", ylabel="validation", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def fine_tune_comparison(rows: list[dict], out: str | Path, title: str = "Fine-tuning") -> Path:
    """Held-out bits per byte before and after each fine-tune (toolkit.report.tables.fine_tune_rows), beside
    the training time each took."""
    plt = _pyplot()
    fig, (quality, cost) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    labels = [r["label"] for r in rows]
    x = range(len(rows))
    quality.bar([i - 0.2 for i in x], [r["bpb_before"] or 0 for r in rows], 0.4, label="before", color="tab:gray")
    quality.bar([i + 0.2 for i in x], [r["bpb_after"] or 0 for r in rows], 0.4, label="after", color="tab:green")
    for i, r in enumerate(rows):
        if r["bpb_after"] is not None:
            quality.annotate(f"{r['bpb_after']:.2f}", (i + 0.2, r["bpb_after"]), ha="center", va="bottom", fontsize=8)
    quality.set(xticks=list(x), xticklabels=labels, ylabel="held-out bits per byte (lower is better)")
    quality.legend(fontsize=8)
    cost.barh(labels, [r["seconds"] or 0 for r in rows], color="tab:blue")
    cost.set(xlabel="training seconds")
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, out)


def scaling(result: dict, out: str | Path) -> Path:
    """A scaling series (``trainbook scale --json``): tokens/s against processes beside the linear ideal (and
    independent runs side by side, when measured), and each count's step time as compute, communication and data
    wait."""
    plt = _pyplot()
    rows = result["runs"]
    counts = [r["nproc"] for r in rows]
    base = rows[0]["tokens_per_s"] / rows[0]["nproc"]
    fig, (speed, parts) = plt.subplots(1, 2, figsize=(11, 3.8))
    speed.plot(counts, [base * n for n in counts], "--", color="gray", lw=1, label="linear: N x 1 process")
    speed.plot(
        counts,
        [r["tokens_per_s"] for r in rows],
        "o-",
        color="tab:blue",
        label=f"{result['engine']}, {result['mode']} scaling",
    )
    for r in rows:
        speed.annotate(
            f"{r['efficiency']:.0%}",
            (r["nproc"], r["tokens_per_s"]),
            textcoords="offset points",
            xytext=(0, -14),
            ha="center",
            fontsize=8,
            color="tab:blue",
        )
    side = [r for r in rows if r.get("side_by_side_tokens_per_s")]
    if side:
        speed.plot(
            [r["nproc"] for r in side],
            [r["side_by_side_tokens_per_s"] for r in side],
            "s",
            mfc="none",
            color="tab:orange",
            ms=8,
            label="independent 1-process runs, side by side",
        )
    speed.set(
        xlabel="processes",
        ylabel="tokens/s (all processes)",
        xticks=counts,
        title="Throughput (efficiency vs linear under the points)",
    )
    speed.set_ylim(bottom=0)
    speed.grid(alpha=0.3)
    speed.legend(fontsize=8)
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    for key, label, colour in (
        ("compute_ms", "compute", "tab:blue"),
        ("communication_ms", "communication", "tab:red"),
        ("data_wait_ms", "data wait", "tab:gray"),
    ):
        values = [r[key] for r in rows]
        parts.bar(x, values, 0.6, bottom=bottom, label=label, color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, r in enumerate(rows):
        parts.annotate(f"{r['step_ms']:.1f} ms", (i, r["step_ms"]), ha="center", va="bottom", fontsize=8)
    parts.set(
        xticks=list(x),
        xticklabels=[f"{r['nproc']} x {r['batch_per_process']}" for r in rows],
        xlabel="processes x sequences per process",
        ylabel="ms per step",
        title="Where a step's time goes",
    )
    parts.set_ylim(top=max(bottom) * 1.15)
    parts.legend(fontsize=8)
    fig.suptitle(f"{result['config']}: {result['measured_steps']} measured steps per run")
    return _save(fig, out)


def forecast_plot(rows: list[dict], out: str | Path, title: str = "Forecast: time against cost") -> Path:
    """A forecast's rows (toolkit.azure.forecast, as dicts): days against cost, one line per size through its node
    counts (labelled), so that the cheapest size for a deadline and the fastest for a budget stand out. Rows whose
    model state does not fit are drawn hollow."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for sku in dict.fromkeys(row["sku"] for row in rows):
        mine = sorted((r for r in rows if r["sku"] == sku), key=lambda r: r["nodes"])
        line = ax.plot([r["cost_usd"] for r in mine], [r["days"] for r in mine], marker="o", label=sku)[0]
        for r in mine:
            if not r["fits"]:
                ax.plot(r["cost_usd"], r["days"], marker="o", markerfacecolor="white", color=line.get_color())
            ax.annotate(
                f"{r['nodes']}", (r["cost_usd"], r["days"]), textcoords="offset points", xytext=(4, 4), fontsize=8
            )
    costs = [r["cost_usd"] for r in rows]
    if min(costs) > 0 and max(costs) / min(costs) > 10:  # a log axis only where costs span decades
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cost, USD (node counts labelled)")
    ax.set_ylabel("wall-clock days")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)
