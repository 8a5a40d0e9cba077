"""What this machine has: software versions, accelerators, CPU, memory, disk and /dev/shm (Azure ML's Compute,
seen from inside). Facts, which :mod:`toolkit.resources.doctor` judges; the judgements a multi-node job's pre-flight
(:mod:`toolkit.runs.job`) makes too are here, so both judge a node alike."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a cgroup cpuset, a container's --cpuset-cpus,
    a pinned test worker), which can be fewer than the machine's ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


# What every training rank does first: a fresh Python importing torch and torch._dynamo (torch.optim imports it).
STARTUP_REFERENCE = "import time, torch, torch._dynamo; print(time.process_time())"


def startup_reference_cpu_s(python: str = sys.executable, timeout_s: float = 300) -> float | None:
    """This machine's speed as one figure: the CPU seconds a fresh ``python`` spends importing torch and
    torch._dynamo (None if it cannot). Wall times of many processes (``make test``) and launch-bound figures (eager
    GPU steps) move with it between days and hosts, so reports quote it beside them."""
    try:
        done = subprocess.run([python, "-c", STARTUP_REFERENCE], capture_output=True, text=True, timeout=timeout_s)
        return float(done.stdout) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def cpu_model() -> str | None:
    """The CPU's model name (Linux: /proc/cpuinfo), else its architecture, or None. Never platform.processor(),
    which on Linux runs `uname -p` in a subprocess (from every training rank that asks)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine() or None


def gpus() -> list[dict]:
    import torch

    if not torch.cuda.is_available():
        return []
    found = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        found.append(
            {
                "index": i,
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "capability": f"{props.major}.{props.minor}",
            }
        )
    return found


def accelerator_versions() -> dict:
    import torch

    cuda = torch.version.cuda
    return {
        "cuda": cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda and torch.cuda.is_available() else None,
    }


@contextlib.contextmanager
def _quiet_fds():
    """Send file descriptors 1 and 2 to /dev/null for a moment: compilers started by a probe write there
    directly, past Python's sys.stdout."""
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


def deepspeed_ops() -> dict:
    """DeepSpeed's version and, per op, whether it can build here (what ``ds_report`` prints), and whether the
    shared-memory comm op is already compiled (otherwise the first distributed DeepSpeed start compiles it)."""
    try:
        from toolkit.third_party import import_deepspeed

        deepspeed = import_deepspeed()
        from deepspeed.ops.op_builder.all_ops import ALL_OPS
    except Exception as exc:  # a broken install is a finding, not a crash
        return {"version": None, "error": f"{type(exc).__name__}: {exc}", "ops": {}}
    ops = {}
    with _quiet_fds():  # probing async_io runs a test link whose "cannot find -laio" would land in the output
        for name, builder in sorted(ALL_OPS.items()):
            if name == "deepspeed_not_implemented":
                continue
            try:
                ops[name] = bool(builder.is_compatible(verbose=False))
            except Exception:  # an op builder that cannot even probe is incompatible
                ops[name] = False
    return {"version": deepspeed.__version__, "ops": ops, "shm_comm_built": shm_comm_built()}


def shm_comm_built(environ=os.environ) -> bool:
    """Whether DeepSpeed's shm comm op is compiled where torch's JIT loader will look: TORCH_EXTENSIONS_DIR/NAME
    when that is set (toolkit.third_party.import_deepspeed sets it to the venv's), else
    ~/.cache/torch_extensions/<python+cuda tag>/NAME (torch.utils.cpp_extension._get_build_directory)."""
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return any(Path(environ["TORCH_EXTENSIONS_DIR"]).glob("deepspeed_shm_comm/*.so"))
    return any((Path.home() / ".cache" / "torch_extensions").glob("*/deepspeed_shm_comm/*.so"))


def memory() -> dict:
    import psutil

    vm = psutil.virtual_memory()
    return {"ram_gib": round(vm.total / 2**30, 1), "ram_available_gib": round(vm.available / 2**30, 1)}


def disk(path: Path) -> dict:
    """Free space where the workspace lives (the nearest existing parent, so a new workspace can be checked)."""
    probe = Path(path).resolve()
    while not probe.exists():
        probe = probe.parent
    usage = shutil.disk_usage(probe)
    return {"path": str(probe), "free_gib": round(usage.free / 2**30, 1), "total_gib": round(usage.total / 2**30, 1)}


def shm() -> dict:
    path = Path("/dev/shm")
    if not path.exists():
        return {"present": False}
    usage = shutil.disk_usage(path)
    return {"present": True, "size_mib": round(usage.total / 2**20), "free_mib": round(usage.free / 2**20)}


def shm_shortfall(num_workers: int, prefetch: int, batch_bytes: int) -> str | None:
    """Why /dev/shm is too small for these DataLoader workers (they hand batches over through it), or None."""
    info = shm()
    if not num_workers or not info["present"]:
        return None
    need = 2 * num_workers * prefetch * batch_bytes  # each worker's batches in flight, with headroom
    if info["free_mib"] * 2**20 >= need:
        return None
    return (
        f"/dev/shm has {info['free_mib']:,} MiB free; {num_workers} workers x prefetch {prefetch} need about "
        f"{need / 2**20:,.0f} MiB: raise it (docker --shm-size, Azure ML shm_size)"
    )


DISK_WARN_FREE_GIB = 5.0


def shm_verdict(info: dict) -> tuple[str, str]:
    """/dev/shm (:func:`shm`) against one DataLoader worker per core: "pass" or "warn", and what was found."""
    if not info["present"]:
        return "warn", "no /dev/shm: DataLoader workers cannot share batches; use data.num_workers=0"
    # One worker per core, prefetching 2 batches of 32 x 2048 int64 tokens (a GPU-sized language-model batch).
    workers, batch_bytes = usable_cores(), 2 * 32 * 2048 * 8
    shortfall = shm_shortfall(workers, 2, batch_bytes)
    summary = f"/dev/shm {info['size_mib']:,} MiB ({info['free_mib']:,} free) for {workers} DataLoader workers"
    return ("warn", shortfall) if shortfall else ("pass", summary)


def discover(workspace: Path) -> dict:
    """Everything above in one JSON-ready dict."""
    import torch

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        **accelerator_versions(),
        "gpus": gpus(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        **memory(),
        "disk": disk(workspace),
        "shm": shm(),
        "deepspeed": deepspeed_ops(),
    }
