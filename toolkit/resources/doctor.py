"""Validate a machine before spending GPU hours on it: facts, health checks, pass / warn / fail with a reason.

    report = run_doctor()          # or: python -m toolkit doctor
    report.ok                      # every required check passed (warnings allowed)
    print(report.table())
    last_report(workspace)         # the latest report run_doctor left in an existing workspace (dict), or None

The checks follow the guide's "validate the setup before a long job": packages match the lock, collectives
work and reach a sane bandwidth, matmul throughput (the peak MFU is measured against), disk write bandwidth
where checkpoints go, /dev/shm for DataLoader workers, and a real training step with each engine.
Each check is a function in ``CHECKS``; a check that raises is a failure with the exception as its reason,
never a crash of the doctor.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable

from toolkit.errors import RefusedValue, not_allowed
from toolkit.machine import DISK_WARN_FREE_GIB
from toolkit.tables import Column, text_table

STATUSES = ("pass", "warn", "fail")
REPORT_NAME = "doctor.json"  # in the workspace: the latest report, what notebook 00's journey reads
DISK_PROBE_BYTES = 128 * 2**20
DISK_WARN_MBPS = 100.0  # below this, checkpoints of a 1B-parameter model (~16 GB with Adam) take minutes
RAM_WARN_AVAILABLE_GIB = 4.0
MATMUL_FAIL_GFLOPS = 5.0  # a working BLAS on any laptop core does more; less means a broken or throttled install
# A busbw below this at the largest message means a misconfigured transport (e.g. NCCL falling back to sockets).
BUSBW_WARN_GBPS = {"nccl": 10.0, "gloo": 0.05}
ENGINE_STEPS = 3
ENGINE_TIMEOUT_S = 180.0  # the first DeepSpeed start on a machine compiles its shm comm op (~35 s here)


@dataclass
class Check:
    name: str
    status: str
    summary: str
    required: bool
    seconds: float = 0.0
    details: dict = field(default_factory=dict)


@dataclass
class DoctorContext:
    """What the checks share: where the workspace is, how many processes to test with, the facts found."""

    workspace: Path
    nproc: int
    facts: dict


@dataclass
class DoctorReport:
    facts: dict
    checks: list[Check]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks if c.required)

    def allreduce_sweep(self):
        """The all-reduce check's sweep (a collectives.SweepResult), or None when that check did not run."""
        from toolkit.resources.collectives import SweepResult

        check = next((c for c in self.checks if c.name == "all-reduce" and c.details), None)
        return SweepResult.from_details(check.details) if check else None

    def to_dict(self) -> dict:
        return {"ok": self.ok, "seconds": self.seconds, "facts": self.facts, "checks": [asdict(c) for c in self.checks]}

    def table(self) -> str:
        verdict = "all required checks pass" if self.ok else "a required check FAILED"
        return (
            text_table(
                self.checks,
                [
                    Column("check", "name"),
                    Column("status", lambda c: c.status.upper()),
                    Column("req", lambda c: "yes" if c.required else "no"),
                    Column("time", lambda c: f"{c.seconds:.1f}s", right=True),
                    Column("reason", "summary"),
                ],
            )
            + f"\n{verdict} ({self.seconds:.0f} s)"
        )


# --- checks -------------------------------------------------------------------------------------------------


def check_packages(ctx: DoctorContext) -> tuple[str, str, dict]:
    from toolkit import paths
    from toolkit.resources import drift

    in_checkout = paths.in_checkout()  # a wheel install has no environment.yml or constraints.txt to compare with
    states = drift.check() if in_checkout else drift.check_installed()
    missing = [s.name for s in states if s.status == "missing"]
    drifted = [f"{s.name} {s.installed} (lock {s.locked})" for s in states if s.status == "drift"]
    details = {"packages": [asdict(s) | {"status": s.status} for s in states]}
    if missing:
        fix = "run `make setup`" if in_checkout else "reinstall trainbook"
        return "fail", f"not installed: {', '.join(missing)} ({fix})", details
    if drifted:
        return "warn", f"drift from constraints.txt: {'; '.join(drifted)}", details
    if not in_checkout:
        return "pass", f"{len(states)} core packages installed (a wheel install: no lock to compare with)", details
    return "pass", f"{len(states)} packages at their locked versions", details


def check_gpus(ctx: DoctorContext) -> tuple[str, str, dict]:
    found = ctx.facts["gpus"]
    if not found:
        return "pass", "no GPU: training runs on CPU with gloo (the local default)", {}
    models = {g["name"] for g in found}
    summary = f"{len(found)} x {', '.join(sorted(models))}, {min(g['memory_gib'] for g in found)} GiB each"
    if len(models) > 1:
        return "warn", f"mixed GPU models ({summary}): the slowest sets the pace of every step", {}
    return "pass", summary + f"; CUDA {ctx.facts['cuda']}, NCCL {ctx.facts['nccl']}", {}


def check_deepspeed_ops(ctx: DoctorContext) -> tuple[str, str, dict]:
    ds = ctx.facts["deepspeed"]
    if ds.get("version") is None:
        return "fail", f"deepspeed does not import: {ds.get('error')}", {}
    wanted = ["cpu_adam", "fused_adam"] + (["deepspeed_shm_comm"] if not ctx.facts["gpus"] else [])
    missing = [op for op in wanted if not ds["ops"].get(op)]
    if missing:
        return "warn", f"deepspeed {ds['version']}: ops that cannot build here: {', '.join(missing)}", ds
    if not ctx.facts["gpus"] and not ds.get("shm_comm_built"):
        return (
            "warn",
            (
                f"deepspeed {ds['version']}: the shm comm op is not compiled yet; the first DeepSpeed run "
                "compiles it (~35 s). Prebuild: DS_BUILD_SHM_COMM=1 pip install deepspeed"
            ),
            ds,
        )
    usable = sum(ds["ops"].values())
    return "pass", f"deepspeed {ds['version']}: {usable} of {len(ds['ops'])} ops compatible", ds


def check_memory(ctx: DoctorContext) -> tuple[str, str, dict]:
    total, available = ctx.facts["ram_gib"], ctx.facts["ram_available_gib"]
    summary = f"{available:g} of {total:g} GiB RAM available, {ctx.facts['cpu_cores']} CPU cores"
    if available < RAM_WARN_AVAILABLE_GIB:
        return "warn", summary + f": under {RAM_WARN_AVAILABLE_GIB:g} GiB, DataLoader workers may be killed", {}
    return "pass", summary, {}


def check_matmul(ctx: DoctorContext) -> tuple[str, str, dict]:
    from toolkit.train.flops import measure_matmul_peak, store_peak

    measured = measure_matmul_peak()
    reference = store_peak(measured)  # the cached figure MFU is computed against: the best measured here
    gflops = measured / 1e9
    details = {"gflops": gflops, "reference_gflops": reference / 1e9}
    if gflops < MATMUL_FAIL_GFLOPS:
        return (
            "fail",
            f"fp32 matmul {gflops:.1f} GFLOP/s: below {MATMUL_FAIL_GFLOPS:g}, a broken or throttled BLAS",
            details,
        )
    kept = (
        "the MFU reference"
        if reference == measured
        else f"the MFU reference stays the best measured here, {reference / 1e9:,.0f} GFLOP/s"
    )
    return "pass", f"fp32 matmul peak {gflops:,.0f} GFLOP/s with {os.cpu_count()} threads ({kept})", details


def check_disk(ctx: DoctorContext) -> tuple[str, str, dict]:
    """Sequential write with fsync where the workspace lives: the path a checkpoint takes to disk."""
    probe_dir = Path(ctx.facts["disk"]["path"])
    free_gib = ctx.facts["disk"]["free_gib"]
    block = os.urandom(8 * 2**20)  # incompressible, so a compressing filesystem cannot flatter the figure
    fd, name = tempfile.mkstemp(dir=probe_dir, prefix=".trainbook-disk-probe-")
    try:
        t0 = time.perf_counter()
        with os.fdopen(fd, "wb") as f:
            for _ in range(DISK_PROBE_BYTES // len(block)):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        mbps = DISK_PROBE_BYTES / (time.perf_counter() - t0) / 1e6
    finally:
        os.unlink(name)
    details = {"write_mbps": mbps, "free_gib": free_gib, "path": str(probe_dir)}
    summary = f"{mbps:,.0f} MB/s write+fsync, {free_gib:,.1f} GiB free in {probe_dir}"
    if free_gib < DISK_WARN_FREE_GIB:
        return "warn", summary + f": under {DISK_WARN_FREE_GIB:g} GiB free, checkpoints will fill it", details
    if mbps < DISK_WARN_MBPS:
        return "warn", summary + f": under {DISK_WARN_MBPS:g} MB/s, large checkpoints will be slow", details
    return "pass", summary, details


def check_shm(ctx: DoctorContext) -> tuple[str, str, dict]:
    from toolkit.machine import shm_verdict

    info = ctx.facts["shm"]
    return *shm_verdict(info), (info if info["present"] else {})


def check_nccl_env(ctx: DoctorContext) -> tuple[str, str, dict]:
    from toolkit.resources import nccl_env

    return nccl_env.summary(os.environ)


def check_allreduce(ctx: DoctorContext) -> tuple[str, str, dict]:
    from toolkit.resources.collectives import allreduce_sweep

    result = allreduce_sweep(ctx.nproc)
    details = result.to_details()
    largest = result.rows[-1]
    summary = (
        f"{result.nproc} processes, {result.backend}: busbw {largest.busbw_gbps:.2f} GB/s at "
        f"{largest.size_bytes / 2**20:g} MiB, {result.rows[0].time_us:,.0f} us at {result.rows[0].size_bytes} B"
    )
    if not all(r.correct for r in result.rows):
        return "fail", "all_reduce returned wrong sums: " + summary, details
    if largest.busbw_gbps < BUSBW_WARN_GBPS.get(result.backend, 0.0):
        return "warn", summary + f": under {BUSBW_WARN_GBPS[result.backend]:g} GB/s expected", details
    return "pass", summary, details


def _engine_step(engine: str) -> Callable[[DoctorContext], tuple[str, str, dict]]:
    def check(ctx: DoctorContext) -> tuple[str, str, dict]:
        """A real run of the tiny config for a few steps, in its own process, as training would start."""
        from toolkit import config as config_mod
        from toolkit.events import TrainEvent, read_events
        from toolkit.runs.launchers import worker_command
        from toolkit.rundir import RunDir

        cfg = config_mod.load(
            "tiny",
            [
                f"engine.name={engine}",
                f"train.max_steps={ENGINE_STEPS}",
                "train.log_every=1",
                f"train.eval_every={ENGINE_STEPS}",
                "train.eval_batches=1",
                "checkpoint.at_end=false",
            ],
        )
        with tempfile.TemporaryDirectory(prefix=f"trainbook-doctor-{engine}-") as tmp:
            run = RunDir.create(Path(tmp) / "run", cfg)
            cmd, env = worker_command(cfg, run.path)
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=ENGINE_TIMEOUT_S,
                env={**os.environ, **env},
                start_new_session=True,
            )
            losses = [e.loss for e in read_events(run, TrainEvent)]
            status = run.read_status()
        if proc.returncode != 0 or status.get("state") != "completed":
            tail = proc.stderr.strip().splitlines()[-3:]
            return "fail", f"{engine}: exit {proc.returncode}, state {status.get('state')}: {' | '.join(tail)}", {}
        if not losses or not all(math.isfinite(x) for x in losses):
            return "fail", f"{engine}: losses {losses} are not finite", {}
        return "pass", f"{engine}: {len(losses)} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}", {"losses": losses}

    return check


@dataclass(frozen=True)
class CheckSpec:
    run: Callable[[DoctorContext], tuple[str, str, dict]]
    required: bool
    about: str


# Order matters only for reading: cheap facts first, then the measurements, then real training.
CHECKS: dict[str, CheckSpec] = {
    "packages": CheckSpec(check_packages, True, "installed packages against environment.yml and the lock"),
    "gpus": CheckSpec(check_gpus, False, "GPU count, model and memory"),
    "deepspeed-ops": CheckSpec(check_deepspeed_ops, False, "DeepSpeed op compatibility (ds_report)"),
    "memory": CheckSpec(check_memory, False, "RAM available"),
    "matmul": CheckSpec(check_matmul, True, "fp32 matmul throughput"),
    "disk": CheckSpec(check_disk, True, "write bandwidth and free space in the workspace"),
    "shm": CheckSpec(check_shm, False, "/dev/shm against DataLoader workers"),
    "nccl-env": CheckSpec(check_nccl_env, False, "NCCL_* settings that slow or break collectives"),
    "all-reduce": CheckSpec(check_allreduce, True, "all-reduce bandwidth sweep across local processes"),
    "train-torch": CheckSpec(_engine_step("torch"), True, "a real training step with the torch engine"),
    "train-deepspeed": CheckSpec(_engine_step("deepspeed"), True, "a real training step with DeepSpeed"),
}


def run_doctor(
    workspace: str | Path | None = None,
    nproc: int | None = None,
    only: list[str] | None = None,
    skip: list[str] | None = None,
    on_check: Callable[[Check], None] | None = None,
) -> DoctorReport:
    """Discover the machine and run the checks in order; ``on_check`` sees each result as it lands."""
    from toolkit import machine
    from toolkit.catalogue.workspace import default_path

    unknown = [n for n in (only or []) + (skip or []) if n not in CHECKS]
    if unknown:
        raise RefusedValue(not_allowed("check", unknown[0], ", ".join(CHECKS), problem="is not a check"))
    if nproc is not None and nproc < 2:
        raise RefusedValue(not_allowed("--nproc", nproc, "2 or more (the all-reduce needs peers)"))
    start = time.perf_counter()
    root = Path(workspace) if workspace else default_path()
    facts = machine.discover(root)
    ctx = DoctorContext(workspace=root, facts=facts, nproc=nproc or max(2, len(facts["gpus"])))
    checks = []
    for name, spec in CHECKS.items():
        if (only and name not in only) or (skip and name in skip):
            continue
        t0 = time.perf_counter()
        try:
            status, summary, details = spec.run(ctx)
        except Exception as exc:  # a check that cannot run has failed; the doctor goes on with the rest
            status, summary, details = "fail", f"{type(exc).__name__}: {exc}", {}
        check = Check(name, status, summary, spec.required, time.perf_counter() - t0, details)
        checks.append(check)
        if on_check is not None:
            on_check(check)
    report = DoctorReport(facts=facts, checks=checks, seconds=time.perf_counter() - start)
    from toolkit.catalogue.workspace import WorkspaceError

    try:
        _keep_report(root, report)
    except (OSError, sqlite3.Error, ValueError, WorkspaceError) as exc:  # a full, read-only or damaged workspace
        warnings.warn(f"the doctor's report was not kept in {root}: {exc}", stacklevel=2)
    return report


def _keep_report(root: Path, report: DoctorReport) -> None:
    """The report, in the workspace whose disk it checked (made if missing, as a first doctor on a new machine is
    the usual start): where the journey (notebook 00) finds it."""
    from toolkit.catalogue.workspace import Workspace
    from toolkit.fsio import atomic_write_text

    ran = {c.name for c in report.checks}
    atomic_write_text(
        Workspace.open(root).root / REPORT_NAME,
        json.dumps({"time": time.time(), **report.to_dict(), "skipped": [n for n in CHECKS if n not in ran]}, indent=1),
    )


def last_report(workspace: str | Path | None = None) -> dict | None:
    """The latest report run_doctor kept in the workspace: to_dict() plus ``time`` and the ``skipped`` checks."""
    from toolkit.catalogue.workspace import Workspace

    ws = Workspace.existing(workspace)
    try:
        report = json.loads((ws.root / REPORT_NAME).read_text()) if ws else None
    except (OSError, ValueError):  # none yet, or a half-edited file: as if the doctor never ran
        return None
    return report if _well_formed(report) else None  # edited by hand, or another version's: as if none


def _well_formed(report) -> bool:
    return (
        isinstance(report, dict)
        and isinstance(report.get("time"), (int, float))
        and isinstance(report.get("skipped"), list)
        and isinstance(report.get("checks"), list)
        and all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("status"), str)
            for c in report["checks"]
        )
    )


def verdict(report: dict) -> tuple[list[str], list[str]]:
    """A kept report's required checks that failed and those skipped (the rule of DoctorReport.ok, by CHECKS)."""
    required = {name for name, spec in CHECKS.items() if spec.required}
    failed = [c["name"] for c in report["checks"] if c["name"] in required and c["status"] == "fail"]
    return failed, [n for n in report["skipped"] if n in required]


def facts_table(facts: dict) -> str:
    """The discovered facts as aligned lines (the head of the doctor's printout)."""
    gpus = ", ".join(f"{g['name']} {g['memory_gib']} GiB" for g in facts["gpus"]) or "none"
    ds = facts["deepspeed"]
    rows = [
        ("python", facts["python"]),
        ("torch", facts["torch"]),
        ("cuda / cudnn / nccl", f"{facts['cuda']} / {facts['cudnn']} / {facts['nccl']}"),
        ("gpus", gpus),
        ("deepspeed", ds.get("version") or ds.get("error")),
        ("cpu cores", facts["cpu_cores"]),
        ("ram", f"{facts['ram_available_gib']} of {facts['ram_gib']} GiB available"),
        ("disk", f"{facts['disk']['free_gib']} of {facts['disk']['total_gib']} GiB free at {facts['disk']['path']}"),
        (
            "/dev/shm",
            f"{facts['shm'].get('free_mib', 0):,} of {facts['shm'].get('size_mib', 0):,} MiB free"
            if facts["shm"]["present"]
            else "absent",
        ),
    ]
    return "\n".join(f"{k:<20} {v}" for k, v in rows)


def status_counts(checks: list[Check]) -> dict[str, int]:
    return {s: sum(c.status == s for c in checks) for s in STATUSES}
