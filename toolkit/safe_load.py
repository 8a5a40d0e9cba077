"""Reading ``.pt`` files that may have come from elsewhere: tensors and plain data only, never code.

A checkpoint's manifest proves that its files are the ones it lists, not who wrote them: a copied run directory
is untrusted, and ``torch.load(weights_only=False)`` runs whatever a pickle names (``os.system`` included). Every
``.pt`` file Trainbook reads goes through this module, which loads with ``weights_only=True`` and allows, on top of
torch's own tensors and containers, only the few plain-data classes our checkpoints hold:

    rank_*.pt      numpy's RNG state (an ndarray of uint32 keys): numpy's array reconstruction and dtypes
    ds/*optim*     DeepSpeed's ZeRO optimizer state: its stage enum, fragment addresses and loss-scaler record

DeepSpeed's own loaders (``engine.load_checkpoint``, ``zero_to_fp32``) call ``torch.load(weights_only=False)``
themselves; :func:`weights_only_everywhere` makes torch refuse code in those calls too (torch's documented
``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` switch), for as long as the block runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from pathlib import Path

from toolkit.errors import refused

# transformers' loaders: never run code a model folder ships (its config's auto_map), never ask on a terminal;
# and for a folder from elsewhere (an export being served) nothing fetched from a hub either.
HF_NO_REMOTE_CODE = {"trust_remote_code": False}
HF_LOCAL_ONLY = {**HF_NO_REMOTE_CODE, "local_files_only": True}

FORCE_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class UnsafeCheckpointError(ValueError):
    """A file that would run code (or build an object we do not allow) if it were unpickled."""


# What a Trainbook checkpoint may name beyond torch's defaults, as the pickle spells it ("module.name").
NUMPY_NAMES = ("numpy._core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",  # the RNG state in rank_*.pt
               "numpy.dtypes.UInt32DType")  # the dtype's class is built while loading: not visible in a static scan
ALLOWED_NAMES = NUMPY_NAMES + (
    "deepspeed.runtime.zero.config.ZeroStageEnum",  # DeepSpeed's ZeRO optimizer files
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
)


def _resolve(names) -> list:
    """The objects behind "module.name" strings (imports the module: only ever one of ALLOWED_NAMES)."""
    objects = []
    for dotted in names:
        module_name, _, attr = dotted.rpartition(".")
        objects.append(getattr(importlib.import_module(module_name), attr))
    return objects


@contextlib.contextmanager
def weights_only_everywhere():
    """Inside this block every ``torch.load`` (ours, DeepSpeed's) loads weights only, with our allow-list (which
    imports DeepSpeed: use it around DeepSpeed's own loaders, which need it anyway)."""
    import torch

    # torch refuses to run with both switches set: a user's TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set aside here.
    previous = {name: os.environ.get(name) for name in (FORCE_ENV, FORCE_NO_ENV)}
    os.environ[FORCE_ENV] = "1"
    os.environ.pop(FORCE_NO_ENV, None)
    try:
        with torch.serialization.safe_globals(_resolve(ALLOWED_NAMES)):
            yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def load(path: str | Path, map_location=None):
    """``torch.load`` of a file from a checkpoint or export: tensors and plain data, or UnsafeCheckpointError
    naming the file and what it would have imported."""
    import pickle

    import torch

    # Read what the pickle names first (cheap, nothing runs), then allow exactly those names: a torch checkpoint
    # does not pay for importing DeepSpeed, and anything outside ALLOWED_NAMES is refused by name.
    names = _named_globals(path)
    disallowed = sorted(set(names) - set(ALLOWED_NAMES))
    if disallowed:
        raise UnsafeCheckpointError(unsafe_reason(path, disallowed))
    try:
        with torch.serialization.safe_globals(_resolve(set(names) | set(NUMPY_NAMES))):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:  # built something not allowed dynamically: refused all the same
        raise UnsafeCheckpointError(unsafe_reason(path, [_first_line(exc)])) from None


def unsafe_reason(path: str | Path, names: list[str]) -> str:
    return refused(Path(path).name, f"loading it would import {', '.join(names) or 'something not allowed'}",
                   f"tensors and plain data (a Trainbook checkpoint names only {', '.join(ALLOWED_NAMES)})")


def disallowed_globals(path: str | Path) -> list[str]:
    """The classes and functions ``path`` would import when unpickled that we do not allow, found by reading the
    pickle's opcodes (nothing is executed, no tensor is read): how a checkpoint listing marks a crafted file."""
    try:
        names = _named_globals(path)
    except UnsafeCheckpointError as exc:
        return [str(exc)]
    return sorted(set(names) - set(ALLOWED_NAMES))


def _named_globals(path: str | Path) -> list[str]:
    """Every class or function the pickle in ``path`` names beyond torch's defaults (static: nothing runs)."""
    import torch

    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except (ValueError, RuntimeError, KeyError, OSError) as exc:  # not a torch.save zip at all
        raise UnsafeCheckpointError(f"(not a torch checkpoint: {_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
