"""Sharded checkpoints: each rank writes only its own shards, and a resume reads them back without unpickling code.

The format is torch.distributed.checkpoint's (DCP), one folder per rank:

    shards/rank_00000/.metadata      which chunk of which tensor is where (global shapes, offsets)
    shards/rank_00000/__0_0.distcp   the chunks themselves (torch.save records, read weights-only)
    shards/rank_00001/...

Each rank saves on its own (``no_dist``: no collective, so the checkpoint writer's background thread never meets
the training thread's collectives on the process group), its DTensors' local chunks at their global offsets. At a
resume the ranks' metadata are merged into one, and DCP reads every rank's chunks into whatever this run's layout
asks for. No rank ever holds more than its own shards plus the chunk being read.

DCP itself unpickles ``.metadata`` with ``pickle.load`` and its non-tensor items with ``torch.load(weights_only=
False)``: either runs whatever a crafted file names. Here ``.metadata`` is read by an unpickler that can build only
DCP's own metadata classes (toolkit.safe_load.DCP_METADATA_NAMES), and non-tensor items are read weights-only.
Every path a metadata file names must be a plain file of its own rank's folder.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
import re
import warnings
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint import load as dcp_load
from torch.distributed.checkpoint import save as dcp_save
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    TensorStorageMetadata,
)

from toolkit.checkpoint.store import SHARDS
from toolkit.errors import refused
from toolkit.safe_load import UNREADABLE, UnsafeCheckpointError, dcp_metadata_allows

METADATA = ".metadata"
RANK_FOLDER = re.compile(r"rank_\d{5}")
DATA_FILE = re.compile(r"__\d+_\d+\.distcp")

# each rank writes alone, on purpose: DCP's warning that no process group is used says nothing to a user
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


def write(folder: Path, state: dict) -> list[str]:
    """This rank's shards of ``state`` (DTensors: their local chunks; other tensors and values whole) into
    ``folder``, fsynced. No collective. Returns the names of the files written, relative to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    dcp_save(state, storage_writer=FileSystemWriter(folder, sync_files=True, overwrite=False), no_dist=True)
    return sorted(p.name for p in folder.iterdir())


def read(shards: Path, state: dict) -> None:
    """Fill ``state`` (this run's layout: DTensors for its shards, plain tensors where it holds them whole) from
    every rank folder under ``shards``, in place. A collective when a process group is up: every rank calls it."""
    metadata = merged_metadata(shards)  # refused here, before DCP (which would wrap the error in its own)
    dcp_load(state, storage_reader=_MergedReader(shards, metadata), planner=_WeightsOnlyPlanner())


def load_into(module: torch.nn.Module, optimizer: torch.optim.Optimizer, shards: Path, options) -> None:
    """A model and its optimizer from a sharded checkpoint, in whatever layout they are now: FSDP's own shards, or
    whole tensors in one process or in DDP's replicas (each reading every rank's chunks of each tensor). ``options``:
    torch's StateDictOptions (LoRA: the trainable tensors only). A collective when a process group is up."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optimizer_state = get_state_dict(module, optimizer, options=options)
    read(shards, {"model": model_state, "optimizer": optimizer_state})  # filled in place
    set_state_dict(module, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state, options=options)


def read_whole(shards: Path, part: str) -> dict[str, torch.Tensor]:
    """One part of a sharded checkpoint (``"model"``) as whole tensors, in a process of its own (no process
    group): what an export reads. Each tensor is assembled from every rank's chunks of it."""
    prefix, metadata = f"{part}.", merged_metadata(shards)
    whole = {
        key[len(prefix) :]: torch.empty(entry.size, dtype=entry.properties.dtype)
        for key, entry in metadata.state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(entry, TensorStorageMetadata)
    }
    dcp_load({part: whole}, storage_reader=_MergedReader(shards, metadata), planner=_WeightsOnlyPlanner())
    return whole


def _unsafe(path: Path, problem: str, allowed: str = "a torch.distributed.checkpoint metadata file"):
    return UnsafeCheckpointError(refused(f"{path.parent.name}/{path.name}", problem, allowed))


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes and nothing else (the pickle module's documented way to restrict globals)."""

    def __init__(self, file, path: Path):
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str):
        if dcp_metadata_allows(module, name):
            return super().find_class(module, name)
        raise _unsafe(self.path, f"names {module}.{name}, which loading would import or call")


def read_metadata(path: Path) -> Metadata:
    """One rank's ``.metadata``, built only from DCP's metadata classes; UnsafeCheckpointError otherwise."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes()), path).load()
    except UnsafeCheckpointError:
        raise
    except UNREADABLE as exc:
        raise _unsafe(path, f"cannot be read ({type(exc).__name__})") from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise _unsafe(path, f"holds a {type(metadata).__name__}, not DCP's Metadata")
    return metadata


def merged_metadata(shards: Path) -> Metadata:
    """Every rank folder's metadata as one: each tensor's chunks from all ranks (a chunk held alike by several, such
    as a replicated value, once), each chunk's storage named relative to ``shards``. Refused when a chunk names a
    file outside its rank's folder, or a tensor's chunks do not cover it exactly."""
    ranks = sorted(p for p in shards.iterdir() if RANK_FOLDER.fullmatch(p.name)) if shards.is_dir() else []
    if not ranks:
        raise UnsafeCheckpointError(refused(SHARDS, "holds no rank folder", "rank_00000, rank_00001, ..."))
    merged: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    storage: dict = {}
    for rank in ranks:
        path = rank / METADATA
        metadata = read_metadata(path)
        for index, info in metadata.storage_data.items():
            name = getattr(info, "relative_path", None)
            if not isinstance(name, str) or not DATA_FILE.fullmatch(name) or not (rank / name).is_file():
                raise _unsafe(path, f"names {name!r} as a shard file", f"a __N_M.distcp file in {rank.name}")
            storage.setdefault(index, dataclasses.replace(info, relative_path=f"{rank.name}/{name}"))
        for key, entry in metadata.state_dict_metadata.items():
            if isinstance(entry, TensorStorageMetadata):
                kept = merged.setdefault(key, TensorStorageMetadata(entry.properties, entry.size, []))
                if not isinstance(kept, TensorStorageMetadata) or kept.size != entry.size:
                    raise _unsafe(path, f"gives {key} another shape than another rank's metadata does")
                known = {tuple(c.offsets) for c in kept.chunks}
                kept.chunks.extend(c for c in entry.chunks if tuple(c.offsets) not in known)
            else:
                merged.setdefault(key, entry)
    for key, entry in merged.items():
        if isinstance(entry, TensorStorageMetadata):
            _check_coverage(shards, key, entry)
    return Metadata(state_dict_metadata=merged, storage_data=storage)


def _check_coverage(shards: Path, key: str, entry: TensorStorageMetadata) -> None:
    """The chunks of a tensor fill it exactly: inside its shape, and as many elements as it has (chunks are
    distinct by offset, and a sharded layout never overlaps them), so no part of it would be left unread."""
    total = 0
    for chunk in entry.chunks:
        if not isinstance(chunk, ChunkStorageMetadata) or len(chunk.offsets) != len(entry.size):
            raise UnsafeCheckpointError(refused(SHARDS, f"{key} has a malformed chunk", "DCP's chunk records"))
        if any(o < 0 or s < 0 or o + s > n for o, s, n in zip(chunk.offsets, chunk.sizes, entry.size)):
            raise UnsafeCheckpointError(refused(SHARDS, f"{key} has a chunk outside its shape", "chunks inside it"))
        total += int(torch.Size(chunk.sizes).numel())
    if total != torch.Size(entry.size).numel():
        raise UnsafeCheckpointError(
            refused(
                SHARDS,
                f"{key}'s chunks hold {total} of its {torch.Size(entry.size).numel()} elements",
                "every rank's shard folder of the checkpoint",
            )
        )


class _MergedReader(FileSystemReader):
    """DCP's file reader over every rank folder at once, given their metadata read safely and merged."""

    def __init__(self, shards: Path, metadata: Metadata):
        super().__init__(shards)
        self.merged = metadata

    def read_metadata(self, *args, **kwargs) -> Metadata:
        return self.merged


class _WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's planner, its non-tensor items (the optimizer's hyperparameters) read weights-only."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            loaded = torch.load(value, weights_only=True)
        except UNREADABLE as exc:
            raise UnsafeCheckpointError(
                refused(
                    read_item.dest_index.fqn,
                    f"cannot be read weights-only ({type(exc).__name__})",
                    "tensors and plain data",
                )
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
