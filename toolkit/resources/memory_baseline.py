"""The baseline of a run's peak memory on a CPU: the peak resident set of a process that trains next to nothing
(Python, torch, deepspeed, gloo, the data and TensorBoard on rank 0), measured by launching the tiny config for a
few steps through `trainbook train`'s own launcher and kept per machine; else the reference machine's figures.
:mod:`toolkit.resources.memory_model` starts each rank's prediction from it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from toolkit.resources.zero_stages import check_value


# The tiny config's peak RSS per rank through `trainbook train` (rank 0, other ranks), MiB, on the reference machine:
# a 2-core x86_64 VM, Linux, Python 3.11, torch 2.13 (CPU), DeepSpeed 0.19.8. Rank 0 also writes events and TensorBoard.
REFERENCE_BASELINE_MIB = {"torch": (322.0, 318.0), "deepspeed": (351.0, 346.0), "fsdp": (338.0, 332.0)}
REFERENCE_MACHINE = "the reference machine (2-core x86_64 VM, torch 2.13 CPU, DeepSpeed 0.19.8)"
BASELINE_STEPS = 4


# --- the baseline: a process that trains nothing ------------------------------------------------------------------


def baseline_cache_path() -> Path:
    from toolkit import paths

    return paths.cache_dir() / "memory_baseline.json"


def _machine_key() -> str:
    from importlib import metadata

    versions = []
    for package in ("torch", "deepspeed"):
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} absent")
    return f"{platform.node()}|{platform.machine()}|{os.cpu_count()}|{'|'.join(versions)}"


def _read_baselines() -> dict:
    try:
        record = json.loads(baseline_cache_path().read_text())
        if record.get("machine") == _machine_key() and isinstance(record.get("engines"), dict):
            return record["engines"]
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def store_baseline(engine: str, ranks: list[float]) -> None:
    """Record this machine's measured baseline for ``engine`` (peak MiB per rank of the tiny config)."""
    from toolkit.fsio import atomic_write_text

    engines = _read_baselines()
    engines[engine] = {"ranks": [float(r) for r in ranks], "measured": time.time()}
    path = baseline_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"machine": _machine_key(), "engines": engines}, indent=1) + "\n")


def baseline_mib(engine: str, nproc: int) -> tuple[tuple[float, ...], str]:
    """Each rank's baseline, MiB, and where the figures come from: this machine's measurement, else the reference."""
    record = _read_baselines().get(engine)
    try:
        ranks = [float(r) for r in record["ranks"]]
        rank0, other = ranks[0], (ranks[1] if len(ranks) > 1 else ranks[0])
        when = time.strftime("%Y-%m-%d", time.localtime(record["measured"]))
        source = f"measured on this machine {when} (the tiny config's peak; `trainbook estimate --measure-baseline`)"
    except (TypeError, KeyError, IndexError, ValueError, OverflowError):
        rank0, other = REFERENCE_BASELINE_MIB[engine]
        source = f"the tiny config's peak on {REFERENCE_MACHINE}; --measure-baseline measures this machine's"
    return (rank0,) + (other,) * (nproc - 1), source


def measure_baseline(engine: str, nproc: int = 2) -> list[float]:
    """Run the tiny config for a few steps as training starts (the launcher, then the worker: what a run's peak
    includes), record each rank's peak as this machine's baseline for ``engine``, and return it (~30 s)."""
    import subprocess
    import tempfile

    from toolkit import config as config_mod
    from toolkit.events import TrainEvent, read_events
    from toolkit.runs.launchers import worker_command
    from toolkit.rundir import RunDir

    check_value("engine", engine, engine in REFERENCE_BASELINE_MIB, ", ".join(REFERENCE_BASELINE_MIB))
    cfg = config_mod.load(
        "tiny",
        [
            f"engine.name={engine}",
            f"engine.nproc={nproc}",
            f"train.max_steps={BASELINE_STEPS}",
            "train.log_every=1",
            f"train.eval_every={BASELINE_STEPS}",
            f"train.eval_batches={nproc}",
            "checkpoint.at_end=false",
            "profile.enabled=false",
        ],
    )
    with tempfile.TemporaryDirectory(prefix=f"trainbook-baseline-{engine}-") as tmp:
        run = RunDir.create(Path(tmp) / "run", cfg)  # not indexed in any workspace: a probe, not a run
        cmd, env = worker_command(cfg, run.path)
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env={**os.environ, **env}, start_new_session=True, timeout=600
        )
        peaks = [e.peak_memory_mb for e in read_events(run, TrainEvent) if e.peak_memory_mb]
    if proc.returncode != 0 or not peaks:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"the {engine} baseline run failed (exit {proc.returncode}): {tail}")
    store_baseline(engine, peaks[-1])
    return peaks[-1]
