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
import pickle
import pickletools
import struct
from pathlib import Path

from toolkit.errors import SHOWN_CHARS, UserError, refused

# transformers' loaders: never run code a model folder ships (its config's auto_map), never ask on a terminal;
# and for a folder from elsewhere (an export being served) nothing fetched from a hub either.
HF_NO_REMOTE_CODE = {"trust_remote_code": False}
HF_LOCAL_ONLY = {**HF_NO_REMOTE_CODE, "local_files_only": True}

FORCE_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_ENV = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class UnsafeCheckpointError(UserError, ValueError):
    """A file that would run code (or build an object we do not allow) if it were unpickled, or that torch cannot
    read at all."""


# What a damaged or crafted .pt file makes torch's readers raise, each meaning "not a file torch.save wrote": its zip
# reader (RuntimeError, ValueError, KeyError for a missing record), the opcode scan and the weights-only unpickler
# (UnpicklingError for an opcode torch never writes, such as protocol 0's; EOFError, struct.error and IndexError
# for one cut short or a stack it never built; Unicode errors, which are ValueErrors; TypeError and AttributeError
# for an allowed function given other arguments), and lengths or nesting written to exhaust the reader (MemoryError,
# OverflowError, RecursionError). Anything else is a bug of ours, and keeps its traceback.
UNREADABLE = (
    pickle.UnpicklingError,
    EOFError,
    struct.error,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    AttributeError,
    RuntimeError,
    OSError,
    MemoryError,
    OverflowError,
    RecursionError,
)


# What a Trainbook checkpoint may name beyond torch's defaults, as the pickle spells it ("module.name").
NUMPY_NAMES = (
    "numpy._core.multiarray._reconstruct",
    "numpy.ndarray",
    "numpy.dtype",  # the RNG state in rank_*.pt
    "numpy.dtypes.UInt32DType",
)  # the dtype's class is built while loading: not visible in a static scan
ALLOWED_NAMES = NUMPY_NAMES + (
    "deepspeed.runtime.zero.config.ZeroStageEnum",  # DeepSpeed's ZeRO optimizer files
    "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
)


# What torch.distributed.checkpoint's .metadata pickles name (a sharded checkpoint, toolkit.checkpoint.sharded), as
# (module, name): its metadata dataclasses, and the torch and pathlib values in them; torch's dtypes besides.
DCP_METADATA_NAMES = frozenset(
    {
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    }
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),  # a layout by its name (torch.strided)
        ("torch", "Size"),
        ("pathlib", "PosixPath"),  # the checkpoint_id it was saved under (a path, never opened)
    }
)
DTYPE_NAMES = frozenset(
    {
        "float64",
        "float32",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "complex64",
        "complex128",
    }
)


def dcp_metadata_allows(module: str, name: str) -> bool:
    """May a DCP .metadata pickle name ``module.name``?"""
    return (module, name) in DCP_METADATA_NAMES or (module == "torch" and name in DTYPE_NAMES)


def pickle_globals(data: bytes) -> list[tuple[str, str]]:
    """Every (module, name) a plain pickle would import, read from its opcodes (nothing runs, nothing is imported).
    STACK_GLOBAL takes the two values pushed just before it (a string or a memo fetch of one, as the pickler writes
    them); anything else there is reported as unknown ("?"), and so refused."""
    found: list[tuple[str, str]] = []
    recent: list[str | None] = []  # what each op pushed, None for anything but a string
    memo: dict[int, str | None] = {}
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE"):
            recent.append(str(arg))
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            recent.append(memo.get(int(arg)) if arg is not None else None)
        elif op.name == "MEMOIZE":
            memo[len(memo)] = recent[-1] if recent else None
        elif op.name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg or 0)] = recent[-1] if recent else None
        elif op.name == "FRAME":
            continue
        elif op.name == "GLOBAL":
            module, _, name = str(arg).partition(" ")
            found.append((module, name))
            recent.append(None)
        elif op.name == "STACK_GLOBAL":
            module_name, global_name = recent[-2:] if len(recent) >= 2 else [None, None]
            found.append((module_name or "?", global_name or "?"))
            recent.append(None)
        else:
            if op.name in ("INST", "OBJ", "EXT1", "EXT2", "EXT4"):  # never written by DCP: refused as unknown
                found.append(("?", op.name))
            recent.append(None)
    return found


def dcp_metadata_problem(path: str | Path, shown: str | None = None) -> str | None:
    """Why a sharded checkpoint's .metadata would be refused (naming the file, as ``shown`` or by its name, and what
    it would import), None if it names only DCP's own metadata classes."""
    shown = shown or Path(path).name
    try:
        names = pickle_globals(Path(path).read_bytes())
    except UNREADABLE as exc:
        return refused(shown, f"cannot be read as a pickle ({_described(exc)})", "DCP's metadata")
    disallowed = sorted({f"{m}.{n}" for m, n in names if not dcp_metadata_allows(m, n)})
    if disallowed:
        return refused(
            shown,
            f"loading it would import {', '.join(disallowed[:3])}",
            "torch.distributed.checkpoint's metadata classes",
        )
    return None


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
    naming the file and what it would have imported (or why torch cannot read it)."""
    return _torch_load(path, _allowed_names(path), map_location=map_location)


def file_problem(path: str | Path) -> str | None:
    """Why :func:`load` would refuse ``path`` (naming the file), None if it would not: how a checkpoint listing marks
    a crafted file. What the pickle names is read from its opcodes; a file that names nothing of DeepSpeed's (which
    DeepSpeed's own loader reads) is then unpickled for real, its tensors memory-mapped rather than read."""
    try:
        names = _allowed_names(path)
        if set(names) <= set(NUMPY_NAMES):
            _torch_load(path, names, map_location="cpu", mmap=True)
    except UnsafeCheckpointError as exc:
        return str(exc)
    return None


def unsafe_reason(path: str | Path, names: list[str]) -> str:
    return refused(
        Path(path).name,
        f"loading it would import {', '.join(names) or 'something not allowed'}",
        f"tensors and plain data (a Trainbook checkpoint names only {', '.join(ALLOWED_NAMES)})",
    )


def unreadable_reason(path: str | Path, exc: BaseException) -> str:
    return refused(
        Path(path).name,
        f"cannot be read as a torch checkpoint ({_described(exc)})",
        "a file torch.save wrote, of tensors and plain data",
    )


def _torch_load(path: str | Path, names: list[str], **options):
    """``torch.load(weights_only=True)`` allowing ``names`` (already checked against ALLOWED_NAMES)."""
    import torch

    try:
        with torch.serialization.safe_globals(_resolve(set(names) | set(NUMPY_NAMES))):
            return torch.load(path, weights_only=True, **options)
    except UNREADABLE as exc:  # built something not allowed dynamically, or the bytes are not torch's: refused
        raise UnsafeCheckpointError(unreadable_reason(path, exc)) from None


def _allowed_names(path: str | Path) -> list[str]:
    """What the pickle in ``path`` names beyond torch's defaults (read first, cheaply: nothing runs), refused if
    anything is outside ALLOWED_NAMES: a torch checkpoint does not pay for importing DeepSpeed, and anything else is
    refused by name."""
    names = _named_globals(path)
    disallowed = sorted(set(names) - set(ALLOWED_NAMES))
    if disallowed:
        raise UnsafeCheckpointError(unsafe_reason(path, disallowed))
    return names


def _named_globals(path: str | Path) -> list[str]:
    """Every class or function the pickle in ``path`` names beyond torch's defaults (static: nothing runs)."""
    import torch

    try:
        return torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except UNREADABLE as exc:  # not a torch.save zip at all, or a pickle torch's scan cannot parse
        raise UnsafeCheckpointError(unreadable_reason(path, exc)) from None


def _described(exc: BaseException) -> str:
    """``Type: first line`` of an error (torch's weights-only refusal: its reason, not its advice), bounded: a
    crafted file chooses much of the text."""
    _, marker, after = str(exc).partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (after if marker else str(exc)).splitlines() if line.strip()]
    reason = lines[0] if lines else ""
    reason = reason if len(reason) <= SHOWN_CHARS else reason[:SHOWN_CHARS] + "..."
    name = "struct.error" if isinstance(exc, struct.error) else type(exc).__name__  # not a bare "error"
    return f"{name}: {reason}" if reason else name
