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
"""

from __future__ import annotations

import os
import sys


def _cpu_only() -> bool:
    """No accelerator DeepSpeed could detect: CUDA, XPU, MPS, or the packages of Ascend NPUs and Gaudi HPUs."""
    import importlib.util

    import torch

    if torch.cuda.is_available() or torch.backends.mps.is_available():
        return False
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return False
    return not any(importlib.util.find_spec(p) for p in ("torch_npu", "habana_frameworks", "torch_mlu", "torch_sdaa"))


def import_deepspeed():
    """``import deepspeed``, without its accelerator guess on a CPU-only machine."""
    if "DS_ACCELERATOR" not in os.environ and _cpu_only():
        os.environ["DS_ACCELERATOR"] = "cpu"
    # process-wide while it lasts: another thread importing mlflow meanwhile would be refused (ranks have none yet)
    hold_off = "mlflow" not in sys.modules and "deepspeed" not in sys.modules
    if hold_off:
        sys.modules["mlflow"] = None  # `import mlflow` raises ImportError; the autotuner's try/except records "absent"
    try:
        import deepspeed
    finally:
        if hold_off and "mlflow" in sys.modules and sys.modules["mlflow"] is None:
            del sys.modules["mlflow"]
    return deepspeed
