"""The facts a GPU check's numbers depend on: the device, its driver, the Python, the versions of what runs and the
host's CPU and speed.

    python bench/gpu_facts.py --json FILE

Prints them and writes them to FILE. Never fails on a missing piece (no torch, no nvidia-smi, no DeepSpeed):
that piece reads as absent, with the reason.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGES = ("torch", "transformers", "peft", "deepspeed", "pydantic", "tensorboard", "onnxruntime", "pytest",
            "numpy", "trainbook")


def versions() -> dict[str, str | None]:
    # metadata, not imports: importing deepspeed or transformers costs seconds and proves nothing here
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def nvidia_smi() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,power.limit",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        return (done.stdout or done.stderr).strip() or None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"


def cuda_facts() -> dict:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - recorded, whatever it is
        return {"device": "no CUDA device", "cuda_available": False, "reason": f"torch not importable: {exc!r}"}
    facts = {"torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
    if not facts["cuda_available"]:
        return {**facts, "device": "no CUDA device"}
    props = torch.cuda.get_device_properties(0)
    return {**facts, "device": torch.cuda.get_device_name(0), "device_count": torch.cuda.device_count(),
            "memory_gib": round(props.total_memory / 2**30, 1), "capability": f"{props.major}.{props.minor}",
            "bf16_supported": torch.cuda.is_bf16_supported(), "nccl": ".".join(map(str, torch.cuda.nccl.version()))}


def build_facts() -> dict:
    """What DeepSpeed's JIT op builds (FusedAdam, CPU Adam) depend on: a compiler, and the architectures asked for."""
    import os
    import shutil

    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:  # noqa: BLE001 - recorded as unknown
        CUDA_HOME = None
    return {"torch_cuda_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST"), "cuda_home": CUDA_HOME,
            "nvcc": shutil.which("nvcc") or (CUDA_HOME and shutil.which("nvcc", path=os.path.join(CUDA_HOME, "bin")))}


def host_facts() -> dict:
    """The host CPU and its speed (toolkit.machine.startup_reference_cpu_s, the figure `make test` ends with): eager
    GPU steps are launch-bound, so two reports' eager figures compare only beside it. At most 15 s: the facts step
    has 60 in all, and a measurement that overruns it is left out, not the other facts."""
    import os

    try:
        from toolkit.machine import cpu_model, startup_reference_cpu_s, usable_cores
    except Exception as exc:  # noqa: BLE001 - recorded, whatever it is
        return {"cores": os.cpu_count(), "reason": f"toolkit not importable: {exc!r}"}
    return {"cpu": cpu_model(), "cores": usable_cores(), "import_torch_cpu_s": startup_reference_cpu_s(timeout_s=15)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args()
    facts = {"python": platform.python_version(), "executable": sys.executable, "platform": platform.platform(),
             **cuda_facts(), **build_facts(), "nvidia_smi": nvidia_smi(), "versions": versions(), "host": host_facts()}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(facts, indent=1))
    for key, value in facts.items():
        print(f"{key:>15}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
