"""Scaling you can see: the same short run at 1, 2, 4... processes, and what each added process bought.

Weak scaling (the guide's data-parallel case) keeps train.batch_size per process, so the global batch grows with
the processes; strong scaling keeps the global batch and splits it. Every run goes through launch.start into a run
directory of its own, one after the other (they would compete for the machine otherwise). Per process count:

- tokens/s, and efficiency against perfect linear scaling: tokens/s(N) / (N x tokens/s(1));
- a step's time, from the run's train events over a measured window (warm-up intervals before it skipped, the
  profiled steps after it left out: the profiler slows them and writes its trace in one of them), split into
- data wait: the events' data_wait_pct over the window;
- communication: from rank 0's profiler trace of a few steps after the window, the time a collective is in flight
  (gloo:all_reduce and the like, on any thread) while the training thread runs no tensor operation, i.e. waits
  for it. A collective hidden behind backward (DDP all-reduces a bucket while later gradients are still being
  computed) costs the step nothing and counts as compute; `in_flight_ms` keeps the whole of it. Only rank 0 is
  profiled, which slows it: it arrives last at each collective, so its waits are the collective's own time, and
  waiting for a slower rank in the unprofiled window is left in compute;
- compute: the rest of the step.

On a CPU the processes share the cores, so each gets the same number of them in every run of the series (usable
cores / the largest count, as train.threads), as each would get a GPU of its own: with 2 cores the 1-process
baseline uses 1 of them. What a GPU box would not see remains: the processes share memory bandwidth (and, on a
shared machine, the cores with everyone else), and gloo reduces on the same cores, so an all-reduce hidden behind
backward still slows it. Both show as compute that grows with the process count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable

from toolkit import config as config_mod
from toolkit.config import ConfigError
from toolkit.errors import PathTaken, not_allowed, refused
from toolkit.events import StatusEvent, TrainEvent, read_events
from toolkit.rundir import RunDir
from toolkit.tables import Column, text_table

MODES = ("weak", "strong")
INTERVALS = 4  # logged intervals in the measured window: enough for a range, few enough that logging stays rare
WARMUP_MIN_STEPS = 3  # the first steps allocate, and DDP rebuilds its buckets after the first
PROFILED_STEPS = 5  # averaged over, so that one step's wait for a peer the OS had descheduled is not the figure
SIDE_BY_SIDE_POLL_S = 0.2
# A port can be taken between the launcher's choice and torchrun's listen (EADDRINUSE, on a machine where others
# start runs too): the supervisor's retry picks another. A retry from step 0 logs every step again, and the window
# reads the last event of each step, so it measures one attempt.
RESTARTS = 1
# collectives as the profiler names them: gloo:all_reduce, nccl:all_reduce, c10d::allreduce_, record_param_comms,
# and NCCL's kernels on a GPU (ncclKernel_AllReduce...); aten:: ops are never communication (aten::broadcast_to)
COLLECTIVE = re.compile(
    r"^(gloo|nccl|mpi|ucc):|^c10d::|^record_param_comms|^nccl|all_?reduce|all_?gather|"
    r"reduce_?scatter|all_?to_?all|broadcast",
    re.IGNORECASE,
)


class ScalingError(RuntimeError):
    """A run of the series did not complete: the series stops there (its message names the run and its log)."""


# --- the plan: pure arithmetic, refused before anything starts ------------------------------------------------------


def parse_counts(text: str) -> list[int]:
    """``"1,2,4"`` -> [1, 2, 4] (sorted, distinct); the baseline 1 is always part of the series."""
    try:
        counts = {int(part) for part in str(text).split(",") if part.strip()}
    except ValueError:
        counts = set()
    if not counts or min(counts) < 1:
        raise ConfigError(not_allowed("--nproc", text, "process counts of 1 or more separated by commas, e.g. 1,2,4"))
    return sorted(counts | {1})


@dataclass(frozen=True)
class Capacity:
    """How many processes a machine can give a device each, and why."""

    processes: int
    why: str
    gpus: bool


def capacity(cuda_devices: int, cores: int) -> Capacity:
    """One process per GPU, else one per usable core."""
    if cuda_devices:
        return Capacity(
            cuda_devices, f"{cuda_devices} GPU{'s' if cuda_devices != 1 else ''}: one process per GPU", gpus=True
        )
    return Capacity(cores, f"{cores} usable core{'s' if cores != 1 else ''}: one process per core", gpus=False)


def machine_capacity() -> Capacity:
    import torch

    from toolkit.machine import usable_cores

    return capacity(torch.cuda.device_count() if torch.cuda.is_available() else 0, usable_cores())


def check_capacity(counts: list[int], machine: Capacity) -> None:
    if max(counts) > machine.processes:
        raise ConfigError(
            not_allowed(
                "--nproc",
                max(counts),
                f"1 to {machine.processes} here ({machine.why})",
                problem="is more processes than this machine can run",
            )
        )


def per_process_batch(batch: int, nproc: int, mode: str) -> int:
    """train.batch_size of each process at ``nproc``: the same (weak), or ``batch`` split evenly (strong)."""
    if mode == "weak":
        return batch
    if batch % nproc:
        divisors = ", ".join(str(d) for d in range(1, batch + 1) if batch % d == 0)
        raise ConfigError(
            not_allowed(
                "--nproc",
                nproc,
                f"with --strong, counts that divide the global batch ({divisors}), or "
                f"--set train.batch_size to a multiple of {nproc}",
                problem=f"does not split train.batch_size={batch} evenly ({batch} / {nproc} = {batch / nproc:g} "
                "sequences per process)",
            )
        )
    return batch // nproc


@dataclass(frozen=True)
class Layout:
    """Where a run's measured window lies: steps (warmup_steps, last_measured], logged every log_every steps."""

    measured_steps: int
    log_every: int
    warmup_steps: int

    @property
    def last_measured(self) -> int:
        return self.warmup_steps + self.measured_steps


def layout(steps: int) -> Layout:
    """``steps`` measured steps, rounded up to INTERVALS whole log intervals, after at least WARMUP_MIN_STEPS
    (whole intervals too, so every logged interval is either in the window or out of it)."""
    if steps < 1:
        raise ConfigError(not_allowed("--steps", steps, "1 or more"))
    every = math.ceil(steps / INTERVALS)
    return Layout(
        measured_steps=every * INTERVALS, log_every=every, warmup_steps=every * math.ceil(WARMUP_MIN_STEPS / every)
    )


def efficiency(tokens_per_s: float, replicas: int, baseline: float) -> float:
    """Against perfect linear scaling: tokens/s(N) / (N x tokens/s(1)), N data-parallel replicas (processes, or
    groups of engine.tensor_parallel x engine.pipeline_parallel processes)."""
    return tokens_per_s / (replicas * baseline)


def replica_counts(counts: list[int], group: int, kind: str = "tensor-parallel groups") -> list[int]:
    """Process counts in whole replicas of ``group`` processes (engine.tensor_parallel x engine.pipeline_parallel;
    ``kind`` names them): the baseline 1 becomes one replica; any other count must be a multiple of it."""
    if group == 1:
        return counts
    odd = [n for n in counts if n != 1 and n % group]
    if odd:
        raise ConfigError(
            not_allowed(
                "--nproc",
                odd[0],
                f"multiples of {group} (each replica is {group} processes)",
                problem=f"is not a whole number of {kind} of {group}",
            )
        )
    return sorted({group, *(n for n in counts if n != 1)})


def above_linear_note(efficiencies) -> str:
    """What an efficiency above 100% means, said under a table that shows one; "" when none does."""
    best = max((e for e in efficiencies if e is not None), default=0.0)
    if best <= 1.0:
        return ""
    return (
        f"Above 100% (up to {best:.0%}): N processes did more than N times what one process did. One process does "
        "not keep this machine busy (its threads wait on each other, or share a core's caches badly), so its "
        "tokens/s is a low baseline for the others, not a ceiling they beat."
    )


def run_settings(
    nproc: int,
    batch: int,
    lay: Layout,
    threads: int,
    profiled: bool,
    max_steps: int | None = None,
    replicas: int | None = None,
) -> list[str]:
    """The fields a run of the series sets on top of the user's: a step budget (no time budget), no checkpoints,
    one evaluation at the end, and the profiler on just after the measured window."""
    steps = max_steps or (lay.last_measured + (2 + PROFILED_STEPS if profiled else 0))
    settings = [
        f"engine.nproc={nproc}",
        f"train.batch_size={batch}",
        f"train.max_steps={steps}",
        "train.max_seconds=0",
        f"train.log_every={lay.log_every}",
        f"train.eval_every={steps}",
        f"train.eval_batches={replicas or nproc}",
        "train.eval_at_start=false",
        "checkpoint.every_steps=0",
        "checkpoint.every_seconds=0",
        "checkpoint.at_end=false",
        f"profile.enabled={str(profiled).lower()}",
    ]
    if profiled:
        # The profiler starts recording in the prof.step() that ends step `wait`: one step after the window, so
        # its start-up lands in an interval that is not measured
        settings += [f"profile.wait={lay.last_measured + 1}", "profile.warmup=1", f"profile.active={PROFILED_STEPS}"]
    if threads:
        settings.append(f"train.threads={threads}")
    return settings


@dataclass(frozen=True)
class RunSpec:
    label: str  # its run directory's name in the series folder
    nproc: int
    config: config_mod.Config

    @property
    def replicas(self) -> int:
        """Data-parallel replicas: the processes over engine.tensor_parallel x engine.pipeline_parallel."""
        return self.nproc // (self.config.engine.tensor_parallel * self.config.engine.pipeline_parallel)


@dataclass(frozen=True)
class Plan:
    config_name: str
    mode: str
    batch: int  # the config's train.batch_size: per process (weak) or global (strong)
    counts: list[int]
    layout: Layout
    threads: int  # per process; 0: the trainer's default (a GPU each)
    out: Path | None  # the series folder; None: a new <runs_root>/<name>-scale-<time>
    runs_root: Path | None
    runs: list[RunSpec]
    side_by_side: dict[int, list[RunSpec]]  # N -> N copies of the 1-process run, started together


def plan(
    config: str,
    overrides: list[str],
    counts: list[int] | None = None,
    mode: str = "weak",
    steps: int = 20,
    out: str | Path | None = None,
    runs_root: str | Path | None = None,
    side_by_side: bool = False,
    machine: Capacity | None = None,
) -> Plan:
    """Every run's config, built and validated now: a bad field, an uneven strong split or a count the machine
    cannot run is refused here, before any folder exists. ``counts``: None for 1, 2, 4... up to the machine's
    capacity; ``machine``: this machine's when None."""
    if mode not in MODES:
        raise ConfigError(not_allowed("mode", mode, ", ".join(MODES)))
    base = config_mod.load(config, overrides)
    machine = machine or machine_capacity()
    # with tensor or pipeline parallelism the unit is a group of processes, one replica
    group = base.engine.tensor_parallel * base.engine.pipeline_parallel
    if counts is None:  # 1, 2, 4... groups, as far as the machine goes (one group at least: refused below if too many)
        counts = [group * 2**i for i in range(max(1, (machine.processes // group).bit_length()))]
    kind = "pipelines" if base.engine.pipeline_parallel > 1 else "tensor-parallel groups"
    counts = replica_counts(counts, group, kind)
    if side_by_side and group > 1:
        raise ConfigError(
            not_allowed(
                "--side-by-side",
                True,
                "without engine.tensor_parallel or engine.pipeline_parallel",
                problem="compares 1-process runs",
            )
        )
    batches = {n: per_process_batch(base.train.batch_size, n // group, mode) for n in counts}
    check_capacity(counts, machine)
    lay = layout(steps)
    # a GPU each: the trainer's default threads; cores: the same share in every run of the series
    threads = base.train.threads or (0 if machine.gpus else max(1, machine.processes // max(counts)))
    name = base.name

    def spec(label, nproc, batch, profiled, max_steps=None):
        settings = run_settings(nproc, batch, lay, threads, profiled, max_steps, replicas=nproc // group)
        return RunSpec(label, nproc, config_mod.load(config, [*overrides, *settings]))

    # the baseline too: a world of one still runs collectives with DeepSpeed (ZeRO over one rank)
    runs = [spec(f"{name}-n{n}", n, batches[n], profiled=True) for n in counts]
    pairs = {}
    if side_by_side:
        # long enough to outlast the trials' start-up skew: stopped once they have overlapped (measure_side_by_side)
        long = lay.last_measured + 50 * lay.measured_steps
        pairs = {
            n: [spec(f"{name}-n1-trial{i + 1}of{n}", 1, batches[1], profiled=False, max_steps=long) for i in range(n)]
            for n in counts
            if n > 1
        }
    _check_engines([r.config for r in runs])
    if out is not None:
        taken = [
            s.label
            for s in [*runs, *(t for trials in pairs.values() for t in trials)]
            if (Path(out) / s.label).exists()
        ]
        if taken:
            raise PathTaken(
                refused(
                    "--out",
                    f"{out} already holds {taken[0]}",
                    "a new folder, or one without this series' run directories",
                )
            )
    return Plan(
        name,
        mode,
        base.train.batch_size,
        counts,
        lay,
        threads,
        Path(out) if out else None,
        Path(runs_root) if runs_root else None,
        runs,
        pairs,
    )


def _check_engines(configs: list[config_mod.Config]) -> None:
    """What launch.start would refuse at some count (fp16 on a CPU, a DeepSpeed file), refused for all now."""
    import torch

    from toolkit.train.engines import check_engine

    for cfg in configs:
        check_engine(cfg, world=cfg.engine.nproc, cuda=torch.cuda.is_available())


def series_folder(p: Plan) -> Path:
    """Made now: --out as given, or a new <runs root>/<name>-scale-<time> (never an existing one)."""
    if p.out is not None:
        p.out.mkdir(parents=True, exist_ok=True)
        return p.out
    from toolkit.runs.launch import default_run_dir

    return default_run_dir(dataclasses.replace(p.runs[0].config, name=f"{p.config_name}-scale"), p.runs_root)


# --- measuring a run: its events and rank 0's trace ----------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """A run's speed over its measured window."""

    tokens_per_s: float
    """All ranks' tokens over the window / its time (the harmonic mean of intervals of equal steps)."""
    tokens_per_s_min: float
    tokens_per_s_max: float
    step_ms: float
    data_wait_pct: float
    """Share of the window spent waiting for batches (time-weighted over its intervals)."""
    first_step: int
    last_step: int


def measure_window(train: list[TrainEvent], first: int, last: int) -> Window:
    """The intervals logged between steps ``first`` (exclusive) and ``last`` (inclusive)."""
    by_step = {e.step: e for e in train}  # a retried run logs its steps again: its last attempt's count
    logged = sorted(by_step)
    intervals = [(by_step[a], by_step[b]) for a, b in zip(logged, logged[1:]) if first <= a and b <= last]
    if not intervals or intervals[0][0].step != first or intervals[-1][1].step != last:
        raise ScalingError(
            f"the run logged no complete window from step {first} to {last} (logged steps: {logged[:12]})"
        )
    seconds = [b.elapsed_s - a.elapsed_s for a, b in intervals]
    steps = [b.step - a.step for a, b in intervals]
    rates = [b.tokens_per_s for _, b in intervals]
    total = sum(seconds)
    # tokens over time: an interval's tokens are proportional to its steps, its time to steps / rate
    return Window(
        tokens_per_s=sum(steps) / sum(n / r for n, r in zip(steps, rates)),
        tokens_per_s_min=min(rates),
        tokens_per_s_max=max(rates),
        step_ms=1e3 * total / sum(steps),
        data_wait_pct=sum(b.data_wait_pct * s for (_, b), s in zip(intervals, seconds)) / total,
        first_step=first,
        last_step=last,
    )


def _union(intervals) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def _intersect(xs, ys) -> list[tuple[float, float]]:
    """Two sorted, disjoint interval lists' common parts."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        start, end = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if start < end:
            out.append((start, end))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


@dataclass(frozen=True)
class Communication:
    """Collectives over the profiled steps, per step."""

    exposed_ms: float
    """In flight while the training thread ran no tensor operation: the step waited for them."""
    in_flight_ms: float
    """In flight at all, hidden behind computation or not."""
    steps: int


def communication(trace: dict) -> Communication:
    """From a torch.profiler Chrome trace: the training thread is the one with the ProfilerStep#N spans; it (or,
    on a GPU, a compute kernel) is busy while a tensor operation runs. Checked against gloo traces of DDP and
    DeepSpeed here; NCCL's kernels are read the same way, untested on this CPU-only machine."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ScalingError("the profiler trace has no ProfilerStep spans")
    main = (steps[0].get("pid"), steps[0].get("tid"))

    def span(e):
        return float(e["ts"]), float(e["ts"]) + float(e["dur"])

    def is_collective(e) -> bool:
        name = str(e.get("name", ""))
        return not name.startswith("aten::") and bool(COLLECTIVE.search(name))

    comm = _union(span(e) for e in events if is_collective(e))
    busy = _union(
        span(e)
        for e in events
        if not is_collective(e)
        and (
            (e.get("pid"), e.get("tid")) == main
            and str(e.get("name", "")).startswith("aten::")
            or e.get("cat") == "kernel"
        )
    )
    in_steps = _intersect(comm, _union(span(s) for s in steps))
    waited = _length(in_steps) - _length(_intersect(in_steps, busy))
    return Communication(
        exposed_ms=waited / 1e3 / len(steps), in_flight_ms=_length(in_steps) / 1e3 / len(steps), steps=len(steps)
    )


def read_trace(run: RunDir) -> dict:
    """Rank 0's trace (the profiler runs on rank 0 only)."""
    import json

    traces = sorted(run.profile_dir.glob("rank0*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)
    if not traces:
        raise ScalingError(f"{run.path}: no profiler trace of rank 0 in {run.profile_dir}")
    path = traces[-1]
    if path.suffix == ".gz":
        import gzip

        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def split(step_ms: float, data_wait_pct: float, comm_ms: float) -> dict[str, float]:
    """A step's time in ms as data wait, communication and compute (the rest); communication is capped at what
    the data wait leaves, so the three always add up to the step."""
    data = step_ms * data_wait_pct / 100
    comm = min(comm_ms, step_ms - data)
    return {"data_wait_ms": data, "communication_ms": comm, "compute_ms": step_ms - data - comm}


# --- running the series ---------------------------------------------------------------------------------------------


@dataclass
class Row:
    """One process count of the series (the JSON of `trainbook scale --json`, one entry of "runs")."""

    nproc: int
    replicas: int
    """Data-parallel replicas: nproc, or nproc / (engine.tensor_parallel x engine.pipeline_parallel)."""
    batch_per_process: int
    global_batch: int
    run_dir: str
    state: str
    tokens_per_s: float
    tokens_per_s_min: float
    tokens_per_s_max: float
    efficiency: float
    step_ms: float
    compute_ms: float
    communication_ms: float
    data_wait_ms: float
    compute: float
    communication: float
    data_wait: float
    in_flight_ms: float
    window_steps: list[int]
    side_by_side_tokens_per_s: float | None = None
    side_by_side_efficiency: float | None = None
    side_by_side_runs: list[str] = field(default_factory=list)


@dataclass
class ScalingResult:
    config: str
    mode: str
    engine: str
    batch: int
    measured_steps: int
    warmup_steps: int
    log_every: int
    threads_per_process: int
    out: str
    rows: list[Row]
    picture: str | None = None
    tensor_parallel: int = 1
    """engine.tensor_parallel: with pipeline_parallel, the processes of a replica; efficiency counts replicas, the
    baseline is one."""
    pipeline_parallel: int = 1
    """engine.pipeline_parallel."""

    def to_dict(self) -> dict:
        doc = dataclasses.asdict(self)
        doc["runs"] = doc.pop("rows")
        return doc

    def table(self) -> str:
        """The series as aligned text lines."""
        whole = self.tensor_parallel * self.pipeline_parallel == 1
        unit = ("per process" if whole else "per replica") if self.mode == "weak" else "global"
        threads = f", {self.threads_per_process} thread(s) per process" if self.threads_per_process else ""
        columns = [
            Column("procs", "nproc", right=True),
            Column("batch", lambda r: f"{r.replicas}x{r.batch_per_process}", right=True),
            Column("tokens/s", "tokens_per_s", ",.0f", right=True),
            Column("range", lambda r: f"{r.tokens_per_s_min:,.0f}-{r.tokens_per_s_max:,.0f}", right=True),
            Column("efficiency", "efficiency", ".0%", right=True),
            Column("step ms", "step_ms", ".1f", right=True),
            Column("compute", "compute", ".0%", right=True),
            Column("comm", "communication", ".0%", right=True),
            Column("data", "data_wait", ".0%", right=True),
        ]
        if any(r.side_by_side_tokens_per_s for r in self.rows):
            columns.append(
                Column(
                    "side by side",
                    lambda r: (
                        f"{r.side_by_side_tokens_per_s:,.0f} tokens/s ({r.side_by_side_efficiency:.0%})"
                        if r.side_by_side_tokens_per_s
                        else ""
                    ),
                )
            )
        note = above_linear_note([r.efficiency for r in self.rows] + [r.side_by_side_efficiency for r in self.rows])
        split = f", replicas of engine.tensor_parallel={self.tensor_parallel}" if self.tensor_parallel > 1 else ""
        split += (
            f", replicas of engine.pipeline_parallel={self.pipeline_parallel}" if self.pipeline_parallel > 1 else ""
        )
        return (
            f"{self.config}, {self.engine}{split}, {self.mode} scaling (train.batch_size {self.batch} {unit}), "
            f"{self.measured_steps} measured steps{threads}\n"
            + text_table(self.rows, columns)
            + (f"\n{note}" if note else "")
        )


def measure_run(run_dir: str | Path, lay: Layout) -> tuple[Window, Communication]:
    run = RunDir(run_dir)
    return measure_window(read_events(run, TrainEvent), lay.warmup_steps, lay.last_measured), communication(
        read_trace(run)
    )


def row(spec: RunSpec, run_dir: Path, lay: Layout, baseline: float | None) -> Row:
    """A completed run's row; ``baseline``: tokens/s of the 1-process run (None: this is it)."""
    window, comm = measure_run(run_dir, lay)
    parts = split(window.step_ms, window.data_wait_pct, comm.exposed_ms)
    t = spec.config.train
    return Row(
        nproc=spec.nproc,
        replicas=spec.replicas,
        batch_per_process=t.batch_size,
        global_batch=t.batch_size * t.grad_accum_steps * spec.replicas,
        run_dir=str(run_dir),
        state=RunDir(run_dir).read_status().get("state", "?"),
        tokens_per_s=window.tokens_per_s,
        tokens_per_s_min=window.tokens_per_s_min,
        tokens_per_s_max=window.tokens_per_s_max,
        efficiency=efficiency(window.tokens_per_s, spec.replicas, baseline or window.tokens_per_s),
        step_ms=window.step_ms,
        **parts,
        compute=parts["compute_ms"] / window.step_ms,
        communication=parts["communication_ms"] / window.step_ms,
        data_wait=parts["data_wait_ms"] / window.step_ms,
        in_flight_ms=comm.in_flight_ms,
        window_steps=[window.first_step, window.last_step],
    )


def _wait(handle) -> None:
    """Wait for a run; one that did not complete stops the series."""
    from toolkit.runs.supervisor import LOG_NAME

    handle.wait()
    state = handle.run.read_status().get("state")
    if state != "completed":
        errors = [e.reason for e in read_events(handle.run, StatusEvent) if e.reason]
        raise ScalingError(
            f"{handle.path.name} ended {state}{f' ({errors[-1]})' if errors else ''}; the series "
            f"stops here (log: {handle.path / LOG_NAME})"
        )


@contextlib.contextmanager
def _stopped_on_the_way_out(handles: list):
    """Runs live in their own sessions: an error or Ctrl-C here must stop them, not leave them training."""
    try:
        yield handles
    except BaseException:
        _stop_all([h for h in handles if h.poll() is None])
        raise


def _stop_all(handles: list) -> None:
    from concurrent.futures import ThreadPoolExecutor

    if handles:
        with ThreadPoolExecutor(len(handles)) as pool:
            list(pool.map(lambda h: h.stop(), handles))


@contextlib.contextmanager
def _own_device(index: int):
    """A trial started alone on the ``index``-th GPU (a 1-process run takes cuda:0 of what it sees); nothing on a
    CPU, where the trials' threads spread over the cores."""
    import torch

    if not torch.cuda.is_available():
        yield
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    os.environ["CUDA_VISIBLE_DEVICES"] = devices[index % len(devices)]
    try:
        yield
    finally:
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible


def _last_attempt(train: list[TrainEvent]) -> list[TrainEvent]:
    """The events since a restart (the step goes back), if there was one."""
    restarts = [i for i in range(1, len(train)) if train[i].step <= train[i - 1].step]
    return train[restarts[-1] :] if restarts else train


def overlapping_windows(trains: list[list[TrainEvent]], warmup: int, intervals: int) -> list[list[TrainEvent]] | None:
    """Each trial's first ``intervals`` logged intervals that began once every trial was past its warm-up (all of
    them training at once), as the events that end them; None until every trial has that many."""
    trains = [_last_attempt(train) for train in trains]
    ends = []
    for train in trains:
        warm = [e for e in train if e.step == warmup]
        if not warm:
            return None
        ends.append(warm[0].time)
    start = max(ends)
    windows = []
    for train in trains:
        inside = [b for a, b in zip(train, train[1:]) if a.step >= warmup and a.time >= start][:intervals]
        if len(inside) < intervals:
            return None
        windows.append(inside)
    return windows


def measure_side_by_side(trials: list[RunSpec], folder: Path, lay: Layout) -> tuple[float, list[str]]:
    """Start the trials together, each a 1-process run with a device (or cores) of its own, let them train until
    each has INTERVALS intervals while all of them run, stop them, and return their tokens/s added up."""
    from toolkit.runs import launch

    handles: list = []
    with _stopped_on_the_way_out(handles):
        for i, trial in enumerate(trials):
            with _own_device(i):
                handles.append(launch.start(trial.config, run_dir=folder / trial.label, max_restarts=RESTARTS))
        trains: list[list[TrainEvent]] = [[] for _ in handles]
        while True:
            for events, handle in zip(trains, handles):
                events.extend(e for e in handle.new_events() if isinstance(e, TrainEvent))
            windows = overlapping_windows(trains, lay.warmup_steps, INTERVALS)
            if windows is not None:
                break
            ended = [h for h in handles if h.poll() is not None]
            if ended:
                raise ScalingError(
                    f"{ended[0].path.name} ended ({ended[0].run.read_status().get('state')}) before "
                    "the trials had trained side by side for a whole window"
                )
            time.sleep(SIDE_BY_SIDE_POLL_S)
        _stop_all(handles)
    total = sum(len(w) / sum(1 / e.tokens_per_s for e in w) for w in windows)
    return total, [str(h.path) for h in handles]


def run_series(p: Plan, on_line: Callable[[str], None] = lambda line: None) -> ScalingResult:
    """Run the plan's runs one after the other (then each count's side-by-side trials) and measure each."""
    from toolkit.runs import launch

    folder = series_folder(p)
    first = p.runs[0].config
    result = ScalingResult(
        config=p.config_name,
        mode=p.mode,
        engine=first.engine.name,
        batch=p.batch,
        measured_steps=p.layout.measured_steps,
        warmup_steps=p.layout.warmup_steps,
        log_every=p.layout.log_every,
        threads_per_process=p.threads,
        out=str(folder),
        rows=[],
        tensor_parallel=first.engine.tensor_parallel,
        pipeline_parallel=first.engine.pipeline_parallel,
    )
    baseline = None
    for spec in p.runs:
        t = spec.config.train
        run_dir = folder / spec.label
        on_line(f"[scale] {spec.nproc} process(es) x {t.batch_size} sequences, {t.max_steps} steps -> {run_dir}")
        handles: list = []
        with _stopped_on_the_way_out(handles):
            handles.append(launch.start(spec.config, run_dir=run_dir, max_restarts=RESTARTS))
            _wait(handles[0])
        r = row(spec, run_dir, p.layout, baseline)
        baseline = baseline or r.tokens_per_s
        if spec.nproc in p.side_by_side:
            trials = p.side_by_side[spec.nproc]
            on_line(
                f"[scale] {len(trials)} independent 1-process runs side by side: {', '.join(t.label for t in trials)}"
            )
            r.side_by_side_tokens_per_s, r.side_by_side_runs = measure_side_by_side(trials, folder, p.layout)
            r.side_by_side_efficiency = efficiency(r.side_by_side_tokens_per_s, spec.nproc, baseline)
        result.rows.append(r)
        side = (
            f", side by side {r.side_by_side_tokens_per_s:,.0f} tokens/s ({r.side_by_side_efficiency:.0%})"
            if r.side_by_side_tokens_per_s
            else ""
        )
        on_line(
            f"[scale] {spec.nproc} process(es): {r.state}, {r.tokens_per_s:,.0f} tokens/s, efficiency "
            f"{r.efficiency:.0%}, step {r.step_ms:.1f} ms = compute {r.compute:.0%} + communication "
            f"{r.communication:.0%} + data wait {r.data_wait:.0%}{side}"
        )
    return result
