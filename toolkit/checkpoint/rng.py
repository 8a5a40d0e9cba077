"""Every random number generator a training step touches, captured and restored (per rank).

Exact resume needs all of them: python's ``random`` and numpy (user code, augmentations), torch's CPU
generator (dropout, sampling), and each CUDA device's generator.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def capture_rng() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
