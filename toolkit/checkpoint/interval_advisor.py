"""How often to checkpoint: the Young/Daly interval from measured checkpoint cost and a failure rate.

Young (1974) and Daly (2006): with a checkpoint costing C seconds of training and a mean time between
failures M, the interval that minimises expected waste is

    T_opt = sqrt(2 C M) - C            (Daly's first-order form, valid for C < M / 2)

A failure then loses on average T/2 of work plus the restart time R, and the overhead (time not spent on
useful training) is about  C / T + (T / 2 + R) / M.

C is the training time a checkpoint *loses* (lost_ms in its event: its blocking plus the slowdown of the steps
its background work overlaps; see toolkit.checkpoint.cost), not only the time it blocks. On a CPU, where the
background write shares the cores with the step, the two differ by orders of magnitude (bench/bench_checkpoint.py);
on a GPU the step runs on the device and the measured loss comes close to the blocking. Runs recorded before
lost_ms existed fall back to their blocking time, and the advice says so. One checkpoint is written at a time,
so the interval is never below the persist time.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

from toolkit.errors import RefusedValue, not_allowed
from toolkit.events import CheckpointEvent, TrainEvent, read_events

# Llama 3 (Dubey et al. 2024, section 3.3.4): 419 unexpected interruptions in 54 days on 16,384 GPUs,
# i.e. one per ~50,700 GPU-hours. Used when the user gives no MTBF of their own.
GPU_HOURS_PER_FAILURE = 16384 * 54 * 24 / 419


@dataclass
class Advice:
    cost_s: float
    persist_s: float
    mtbf_s: float
    restart_s: float
    interval_s: float
    interval_steps: int | None
    lost_work_per_failure_s: float
    overhead_pct: float
    formula: str
    step_time_s: float | None = None
    cost_basis: str = "lost"  # "lost": measured training time lost; "blocking": an older run's blocking time
    blocking_s: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        steps = f" (every {self.interval_steps:,} steps)" if self.interval_steps else ""
        cost = (
            f"training time lost {_ms(self.cost_s)} per checkpoint"
            + (f" (of which blocked {_ms(self.blocking_s)})" if self.blocking_s is not None else "")
            if self.cost_basis == "lost"
            else f"cost {_ms(self.cost_s)} per checkpoint (this run recorded only its blocking time: the real cost "
            f"may be higher)"
        )
        return (
            f"checkpoint every {duration(self.interval_s)}{steps}: {cost}, MTBF {duration(self.mtbf_s)}, "
            f"expected loss per failure {duration(self.lost_work_per_failure_s)}, overhead "
            f"{self.overhead_pct:.2f}%\n{self.formula}"
        )


def mtbf_for_gpus(gpus: int) -> float:
    """Seconds between failures for a job on this many GPUs, at Llama 3's observed failure rate."""
    if gpus < 1:
        raise RefusedValue(not_allowed("gpus", gpus, "1 or more"))
    return GPU_HOURS_PER_FAILURE * 3600 / gpus


def overhead_pct(interval_s: float, cost_s: float, mtbf_s: float, restart_s: float) -> float:
    """Time lost, in % of training time, when checkpointing every ``interval_s``: the cost of each checkpoint,
    plus per failure half an interval of recomputed work and the restart."""
    return 100 * (cost_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s)


def advise(
    cost_s: float,
    mtbf_s: float,
    persist_s: float = 0.0,
    restart_s: float = 60.0,
    step_time_s: float | None = None,
    cost_basis: str = "lost",
    blocking_s: float | None = None,
) -> Advice:
    for name, value in (("cost_s", cost_s), ("mtbf_s", mtbf_s)):
        if not value > 0:
            raise RefusedValue(not_allowed(name, value, "a positive number of seconds"))
    for name, value in (("persist_s", persist_s), ("restart_s", restart_s)):
        if not value >= 0:  # NaN too: it would make every figure of the advice NaN
            raise RefusedValue(not_allowed(name, value, "0 or more seconds"))
    young_daly = math.sqrt(2 * cost_s * mtbf_s) - cost_s if cost_s < mtbf_s / 2 else mtbf_s
    interval = max(young_daly, persist_s, cost_s)
    lost = interval / 2 + restart_s
    overhead = overhead_pct(interval, cost_s, mtbf_s, restart_s)
    if cost_s < mtbf_s / 2:
        formula = (
            f"T = sqrt(2 C M) - C = sqrt(2 x {cost_s:.4g} s x {mtbf_s:,.0f} s) - {cost_s:.4g} s = {young_daly:,.1f} s"
        )
    else:  # outside the first-order form's range: checkpoint once per MTBF
        formula = f"C = {cost_s:.4g} s is at least half the MTBF M = {mtbf_s:,.0f} s: T = M = {young_daly:,.1f} s"
    if interval > young_daly:  # whichever of the two raised it
        formula += (
            f"; raised to the persist time {persist_s:,.1f} s"
            if persist_s >= cost_s
            else f"; raised to the checkpoint cost {cost_s:,.1f} s"
        )
    steps = max(1, round(interval / step_time_s)) if step_time_s else None
    return Advice(
        cost_s,
        persist_s,
        mtbf_s,
        restart_s,
        interval,
        steps,
        lost,
        overhead,
        formula,
        step_time_s,
        cost_basis,
        blocking_s,
    )


def advise_for_run(run_dir, mtbf_s: float, restart_s: float = 60.0) -> Advice:
    """Advice from a run's own measurements: median training time lost per checkpoint (the blocking time for a
    run recorded before lost_ms existed), median persist time, and its step time."""
    checkpoints = read_events(run_dir, CheckpointEvent)
    if not checkpoints:
        raise RefusedValue(
            not_allowed(
                "run_dir",
                run_dir,
                "a run that checkpointed (set checkpoint.every_steps)",
                problem="has no checkpoint events",
            )
        )
    train = read_events(run_dir, TrainEvent)
    step_time = None
    if len(train) >= 2:
        steps = train[-1].step - train[0].step
        seconds = train[-1].elapsed_s - train[0].elapsed_s
        step_time = seconds / steps if steps and seconds > 0 else None
    measured = [c for c in checkpoints if c.lost_ms is not None]
    blocking = statistics.median(c.blocking_ms for c in checkpoints) / 1e3
    cost = statistics.median(c.lost_ms for c in measured) / 1e3 if measured else blocking
    return advise(
        cost_s=cost,
        persist_s=statistics.median(c.persist_ms for c in checkpoints) / 1e3,
        mtbf_s=mtbf_s,
        restart_s=restart_s,
        step_time_s=step_time,
        cost_basis="lost" if measured else "blocking",
        blocking_s=blocking,
    )


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def duration(seconds: float) -> str:
    """Seconds as people read a span: '42.0 s', '7.5 min', '12.3 h'."""
    if seconds < 120:
        return f"{seconds:,.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"
