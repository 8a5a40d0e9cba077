"""engine.name=fsdp's rules before a run starts, and the sharded checkpoint format (toolkit.checkpoint.sharded): each
rank's DCP metadata read without running code, merged, and refused when it names files outside its folder, leaves a
tensor partly uncovered or would import anything but DCP's own classes."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from toolkit import config as config_mod
from toolkit import safe_load
from toolkit.checkpoint import sharded
from toolkit.safe_load import UnsafeCheckpointError

from unit.test_untrusted_checkpoints import RunsCode


@pytest.mark.parametrize("overrides, message", [
    (["engine.precision=fp16"], "engine.precision: 'fp16' is not supported with engine.name='fsdp'"),
    (["train.compile=true"], "train.compile: True is not supported with engine.name='fsdp'"),
    (["engine.zero_stage=3"], "engine.zero_stage: 3 needs engine.name='deepspeed'; allowed: 0 with engine.name='fsdp'"),
    (["engine.tensor_parallel=2"], "engine.name: 'fsdp' is not supported with engine.tensor_parallel=2"),
])
def test_what_fsdp_does_not_take_yet_is_refused_naming_the_field(overrides, message):
    with pytest.raises(config_mod.ConfigError) as caught:
        config_mod.load("tiny", ["engine.name=fsdp", *overrides])
    assert message in str(caught.value)


def test_fsdp_settings_are_refused_for_other_engines():
    with pytest.raises(config_mod.ConfigError) as caught:
        config_mod.load("tiny", ["engine.fsdp_offload=true"])
    assert "engine.fsdp_offload: True is set while engine.name='torch'; allowed: False unless engine.name='fsdp'" in str(caught.value)
    cfg = config_mod.load("tiny", ["engine.name=fsdp", "engine.fsdp_reshard_after_forward=false"])
    assert cfg.engine.name == "fsdp" and not cfg.engine.fsdp_reshard_after_forward


# --- the format -------------------------------------------------------------------------------------------------

PROPERTIES = TensorProperties(dtype=torch.float32)


def write_rank(shards: Path, rank: int, rows: slice, size=(4, 2), relative_path: str = "__0_0.distcp") -> Path:
    """A rank folder as DCP writes it: ``rows`` of a (4, 2) tensor "model.w" in its data file."""
    folder = shards / f"rank_{rank:05d}"
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"\0" * 64)
    offsets, sizes = torch.Size([rows.start, 0]), torch.Size([rows.stop - rows.start, size[1]])
    metadata = Metadata(
        state_dict_metadata={"model.w": TensorStorageMetadata(PROPERTIES, torch.Size(size),
                                                              [ChunkStorageMetadata(offsets, sizes)])},
        storage_data={MetadataIndex("model.w", offsets): _StorageInfo(relative_path, 0, 64)},
    )
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    return folder


def test_every_ranks_chunks_merge_into_one_metadata_each_named_in_its_own_folder(tmp_path):
    write_rank(tmp_path, 0, slice(0, 2))
    write_rank(tmp_path, 1, slice(2, 4))
    merged = sharded.merged_metadata(tmp_path)
    (entry,) = merged.state_dict_metadata.values()
    assert sorted(tuple(c.offsets) for c in entry.chunks) == [(0, 0), (2, 0)]
    assert sorted(info.relative_path for info in merged.storage_data.values()) == [
        "rank_00000/__0_0.distcp", "rank_00001/__0_0.distcp"]
    assert safe_load.dcp_metadata_problem(tmp_path / "rank_00000" / ".metadata") is None


def test_a_missing_rank_leaves_a_tensor_uncovered_and_is_refused(tmp_path):
    write_rank(tmp_path, 0, slice(0, 2))
    with pytest.raises(UnsafeCheckpointError, match=r"model\.w's chunks hold 4 of its 8 elements"):
        sharded.merged_metadata(tmp_path)


@pytest.mark.parametrize("relative_path", ["../../outside.distcp", "/etc/passwd", "rank_00001/__0_0.distcp",
                                           "__9_9.distcp"])
def test_a_shard_file_outside_its_ranks_folder_or_missing_is_refused(tmp_path, relative_path):
    write_rank(tmp_path, 0, slice(0, 2), relative_path=relative_path)
    write_rank(tmp_path, 1, slice(2, 4))
    with pytest.raises(UnsafeCheckpointError, match="as a shard file; allowed: a __N_M.distcp file in rank_00000"):
        sharded.merged_metadata(tmp_path)


def test_a_chunk_outside_its_tensor_is_refused(tmp_path):
    write_rank(tmp_path, 0, slice(0, 2))
    write_rank(tmp_path, 1, slice(2, 6), size=(4, 2))
    with pytest.raises(UnsafeCheckpointError, match="has a chunk outside its shape"):
        sharded.merged_metadata(tmp_path)


@pytest.mark.parametrize("protocol", [0, 2, 4])
def test_a_crafted_metadata_file_is_refused_unread_and_runs_nothing(tmp_path, protocol):
    folder = write_rank(tmp_path, 0, slice(0, 4))
    marker = tmp_path / "code-ran"
    (folder / ".metadata").write_bytes(pickle.dumps(RunsCode(marker), protocol=protocol))
    problem = safe_load.dcp_metadata_problem(folder / ".metadata")
    assert problem and "loading it would import posix.system" in problem, problem
    with pytest.raises(UnsafeCheckpointError, match="names posix.system, which loading would import or call"):
        sharded.merged_metadata(tmp_path)
    assert not marker.exists(), "a crafted .metadata ran"


def test_a_ranks_own_shards_round_trip_to_whole_tensors(tmp_path):
    """One rank's save (no process group: what a single process writes) read back whole, as an export reads it."""
    state = {"model": {"w": torch.arange(8.0).view(4, 2), "b": torch.ones(3)}, "optimizer": {"lr": 0.5}}
    written = sharded.write(tmp_path / "rank_00000", state)
    assert written == [".metadata", "__0_0.distcp"] and os.listdir(tmp_path) == ["rank_00000"]
    assert safe_load.dcp_metadata_problem(tmp_path / "rank_00000" / ".metadata") is None
    whole = sharded.read_whole(tmp_path, "model")
    assert set(whole) == {"w", "b"} and torch.equal(whole["w"], state["model"]["w"])
