"""Third-party imports that would otherwise talk to our users about themselves.

DeepSpeed, imported on a machine without CUDA, guesses its accelerator out loud ("[WARNING] Setting accelerator to
CPU. If you have GPU or other accelerator, we were unable to detect it.") in every process that imports it: the
doctor, notebook 01, each training rank. On such a machine we name the accelerator it would pick anyway
(DS_ACCELERATOR=cpu, DeepSpeed's own override, logged at INFO, below its WARNING default), in this process's
environment so the processes it starts inherit it. A DS_ACCELERATOR the user set is kept.

DeepSpeed's autotuner (deepspeed.autotuning.autotuner, imported by ``import deepspeed`` itself) also runs
``import mlflow`` whenever mlflow is installed, which the tracking extra does: ~2 s of CPU and ~150 MiB in every
training rank (measured: the tiny DeepSpeed config's peak went 351 -> 541 MiB on rank 0), for an autotuner we never
run. A rank logs nothing to MLflow (toolkit.train.tracking's follower process does), so the import is held off while
DeepSpeed loads; mlflow stays importable afterwards.

DeepSpeed's JIT op builder (FusedAdam's, at the first step on a GPU) parses TORCH_CUDA_ARCH_LIST as MAJOR.MINOR[+PTX]
and fails on the architecture-specific entries PyTorch accepts (9.0a, 10.0f), which GPU images set: "ValueError:
invalid literal for int() with base 10: '0a'" on an H200. DeepSpeed is handed the list without those suffixes (9.0a
builds as 9.0, the same GPU's portable code, all FusedAdam uses), said on stderr.
"""

from __future__ import annotations

import os
import re
import sys

from toolkit.startup import long_lived

_ARCH_SUFFIX = re.compile(r"^(\d+\.\d+)[af](\+PTX)?$")


def _cpu_only() -> bool:
    """No accelerator DeepSpeed could detect: CUDA, XPU, MPS, or the packages of Ascend NPUs and Gaudi HPUs."""
    import importlib.util

    import torch

    if torch.cuda.is_available() or torch.backends.mps.is_available():
        return False
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return False
    return not any(importlib.util.find_spec(p) for p in ("torch_npu", "habana_frameworks", "torch_mlu", "torch_sdaa"))


def deepspeed_arch_list(value: str | None) -> str | None:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed's op builder can parse it (9.0a -> 9.0, 10.0f+PTX -> 10.0+PTX), or None when
    it parses as it is."""
    entries = [e for e in re.split(r"[;\s]+", value or "") if e]
    if not any(_ARCH_SUFFIX.match(e) for e in entries):
        return None
    return ";".join(_ARCH_SUFFIX.sub(r"\1\2", e) for e in entries)


def import_deepspeed():
    """``import deepspeed``, without its accelerator guess on a CPU-only machine, building its ops into this Python
    environment's own cache."""
    # DeepSpeed JIT-compiles its ops into TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions, shared by every
    # Python environment of the user: two checkouts (or CI's clone) then invalidate each other's build and each
    # recompiles (~35 s). One cache per environment (`make setup` fills it); set here, where DeepSpeed comes in, so
    # the processes this one starts inherit it and `import toolkit` changes nothing.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    if "DS_ACCELERATOR" not in os.environ and _cpu_only():
        os.environ["DS_ACCELERATOR"] = "cpu"
    given = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if (handed := deepspeed_arch_list(given)) is not None:
        os.environ["TORCH_CUDA_ARCH_LIST"] = handed
        print(
            f"TORCH_CUDA_ARCH_LIST {given!r} handed to DeepSpeed as {handed!r}: its op builder does not read "
            f"architecture-specific entries",
            file=sys.stderr,
            flush=True,
        )
    # process-wide while it lasts: another thread importing mlflow meanwhile would be refused (ranks have none yet)
    hold_off = "mlflow" not in sys.modules and "deepspeed" not in sys.modules
    if hold_off:
        sys.modules["mlflow"] = None  # `import mlflow` raises ImportError; the autotuner's try/except records "absent"
    try:
        with long_lived():  # torch and DeepSpeed stay loaded for the process's life (toolkit.startup)
            import deepspeed
    finally:
        if hold_off and "mlflow" in sys.modules and sys.modules["mlflow"] is None:
            del sys.modules["mlflow"]
    return deepspeed
