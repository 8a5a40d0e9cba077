"""Third-party imports that would otherwise talk to our users about themselves.

DeepSpeed, imported on a machine without CUDA, guesses its accelerator out loud ("[WARNING] Setting accelerator to
CPU. If you have GPU or other accelerator, we were unable to detect it.") in every process that imports it: the
doctor, notebook 01, each training rank. On such a machine we name the accelerator it would pick anyway
(DS_ACCELERATOR=cpu, DeepSpeed's own override, logged at INFO, below its WARNING default), in this process's
environment so the processes it starts inherit it. A DS_ACCELERATOR the user set is kept.
"""

from __future__ import annotations

import os


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
    import deepspeed

    return deepspeed
