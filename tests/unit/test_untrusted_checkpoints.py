"""A checkpoint folder read from disk is untrusted: no pickle runs code, no name in LATEST or a manifest leads out
of the run, and nothing unlisted or linked is ever loaded. Pure file logic: small torch.save files, no training."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from toolkit import safe_load
from toolkit.checkpoint.store import MANIFEST, CheckpointStore, describe_files, step_name
from toolkit.checkpoint.rng import capture_rng


class RunsCode:
    """A pickle that, when loaded without weights_only, creates the file it names (a harmless os.system)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def write_checkpoint(root: Path, step: int, files: dict) -> Path:
    """A published checkpoint whose manifest lists ``files`` ({name: object to torch.save}) with true hashes: a
    manifest proves the bytes are the listed ones, not that they are safe."""
    folder = root / "checkpoints" / step_name(step)
    folder.mkdir(parents=True)
    for name, obj in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        torch.save(obj, folder / name)
    manifest = {"step": step, "world_size": 1, "engine": "torch", "config": {},
                "trainer": {"step": step, "horizon": step, "train_seconds": 1.0},
                "files": describe_files(folder, files)}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    (root / "checkpoints" / "LATEST").write_text(folder.name + "\n")
    return folder


def good_files() -> dict:
    return {"model.pt": {"w": torch.ones(3)}, "optimizer.pt": {"state": {}, "param_groups": []},
            "rank_00000.pt": {"rng": capture_rng()}}


def test_a_pickle_that_runs_code_is_refused_by_the_loader_and_marked_invalid(tmp_path):
    marker = tmp_path / "code-ran"
    folder = write_checkpoint(tmp_path / "run", 10, {**good_files(), "rank_00000.pt": {"rng": RunsCode(marker)}})

    with pytest.raises(safe_load.UnsafeCheckpointError, match=r"rank_00000.pt: loading it would import posix.system"):
        safe_load.load(folder / "rank_00000.pt")
    info = CheckpointStore(tmp_path / "run").inspect(folder)
    assert not info.valid and "posix.system" in info.reason, info.reason
    assert CheckpointStore(tmp_path / "run").find_resume_point()[0] is None
    assert not marker.exists(), "loading a checkpoint ran code"


def test_third_party_loaders_are_forced_to_weights_only_inside_the_guard(tmp_path):
    """DeepSpeed calls torch.load(weights_only=False) itself; inside weights_only_everywhere() that refuses code."""
    marker = tmp_path / "code-ran"
    torch.save({"x": RunsCode(marker)}, tmp_path / "states.pt")
    before = os.environ.get(safe_load.FORCE_ENV)
    with safe_load.weights_only_everywhere():
        with pytest.raises(Exception, match="Weights only load failed"):
            torch.load(tmp_path / "states.pt", weights_only=False)
    assert os.environ.get(safe_load.FORCE_ENV) == before, "the switch must not outlive the block"
    assert not marker.exists()


def test_a_real_rng_state_loads_and_round_trips(tmp_path):
    torch.save({"rng": capture_rng()}, tmp_path / "rank.pt")
    assert safe_load.file_problem(tmp_path / "rank.pt") is None
    state = safe_load.load(tmp_path / "rank.pt")["rng"]
    assert state["numpy"][0] == "MT19937" and torch.equal(state["torch"], torch.get_rng_state())


@pytest.mark.parametrize("latest", ["../../../etc", "/etc", "step_1/../../x", "checkpoints/../step_00000010",
                                    "step_00000010\x00", ""])
def test_latest_never_leads_out_of_the_run(tmp_path, latest):
    run = tmp_path / "run"
    write_checkpoint(run, 10, good_files())
    outside = write_checkpoint(tmp_path / "elsewhere", 20, good_files())  # a valid checkpoint, not this run's
    (run / "checkpoints" / "LATEST").write_text(latest)
    store = CheckpointStore(run)
    info, skipped = store.find_resume_point()
    assert info.path == run / "checkpoints" / step_name(10), f"LATEST {latest!r} led to {info.path}"
    assert store.latest_name() is None
    if latest:
        assert "allowed: a checkpoint name such as step_00000100" in skipped[0].reason
    assert outside.exists()


def test_links_and_unlisted_files_make_a_checkpoint_invalid(tmp_path):
    run = tmp_path / "run"
    elsewhere = write_checkpoint(tmp_path / "elsewhere", 30, good_files())
    folder = write_checkpoint(run, 10, good_files())
    store = CheckpointStore(run)

    (run / "checkpoints" / step_name(30)).symlink_to(elsewhere, target_is_directory=True)
    (run / "checkpoints" / "LATEST").write_text(step_name(30))
    info, skipped = store.find_resume_point()
    assert info.name == step_name(10) and "is a link" in skipped[0].reason, skipped[0].reason
    assert [p.name for p in store.published()] == [step_name(10)]

    (folder / "extra.pt").write_bytes((folder / "model.pt").read_bytes())
    assert "extra.pt is not listed in manifest.json" in store.inspect(folder).reason
    (folder / "extra.pt").unlink()

    model = folder / "model.pt"
    target = tmp_path / "real-model.pt"
    model.rename(target)
    model.symlink_to(target)  # same bytes, same hash: still refused, a link may lead anywhere
    assert "model.pt is a symbolic link to" in store.inspect(folder).reason


@pytest.mark.parametrize("change, reason", [
    (lambda m: m["files"].update({"../outside.pt": {"size": 1, "sha256": "0"}}), "'../outside.pt' is not allowed"),
    (lambda m: m["files"].update({"/etc/passwd": {"size": 1, "sha256": "0"}}), "'/etc/passwd' is not allowed"),
    (lambda m: m.update(step="10"), "step: '10'"),
    (lambda m: m.update(step=11), "does not match the folder name"),
    (lambda m: m.update(world_size=0), "world_size: 0"),
    (lambda m: m.update(engine="pickle"), "engine: 'pickle'"),
    (lambda m: m.update(trainer=[]), "trainer: []"),
    (lambda m: m.update(files=[]), "files: []"),
    (lambda m: m["files"].update({"model.pt": {"size": "big", "sha256": "x"}}), "files.model.pt"),
    (lambda m: m.clear() or m.update(x=1), "step: None"),
])
def test_malformed_manifests_are_invalid_with_the_field_named(tmp_path, change, reason):
    folder = write_checkpoint(tmp_path / "run", 10, good_files())
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    info = CheckpointStore(tmp_path / "run").inspect(folder)
    assert not info.valid and reason in info.reason, info.reason


def test_a_manifest_that_is_not_an_object_is_invalid(tmp_path):
    folder = write_checkpoint(tmp_path / "run", 10, good_files())
    (folder / MANIFEST).write_text("[1, 2]")
    assert "a JSON list" in CheckpointStore(tmp_path / "run").inspect(folder).reason


def test_a_good_checkpoint_is_valid(tmp_path):
    folder = write_checkpoint(tmp_path / "run", 10, good_files())
    info, skipped = CheckpointStore(tmp_path / "run").find_resume_point()
    assert info.valid and info.path == folder and not skipped, info.reason


def test_nothing_is_written_or_deleted_through_a_linked_checkpoints_folder(tmp_path):
    elsewhere = tmp_path / "someone-elses"
    for step in (1, 2, 3):
        write_checkpoint(elsewhere, step, good_files())
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoints").symlink_to(elsewhere / "checkpoints", target_is_directory=True)
    store = CheckpointStore(run)
    for call in (lambda: store.apply_retention(1), store.discard_partial, lambda: store.roll_back_to(step_name(1))):
        with pytest.raises(Exception, match="is a link to"):
            call()
    assert sorted(p.name for p in (elsewhere / "checkpoints").iterdir()) == [
        "LATEST", step_name(1), step_name(2), step_name(3)]


def test_the_guard_works_for_users_who_set_the_opposite_switch(tmp_path, monkeypatch):
    marker = tmp_path / "code-ran"
    torch.save({"x": RunsCode(marker)}, tmp_path / "states.pt")
    monkeypatch.setenv(safe_load.FORCE_NO_ENV, "1")  # torch refuses to load at all when both are set
    with safe_load.weights_only_everywhere():
        with pytest.raises(Exception, match="Weights only load failed"):
            torch.load(tmp_path / "states.pt", weights_only=False)
    assert os.environ[safe_load.FORCE_NO_ENV] == "1" and safe_load.FORCE_ENV not in os.environ
    assert not marker.exists()


def test_fifos_and_huge_metadata_are_refused_without_blocking_or_reading_them(tmp_path):
    run = tmp_path / "run"
    folder = write_checkpoint(run, 10, good_files())
    store = CheckpointStore(run)
    latest = run / "checkpoints" / "LATEST"
    latest.unlink()
    os.mkfifo(latest)  # a read would wait forever for a writer
    info, skipped = store.find_resume_point()
    assert info.path == folder and "not a regular file" in skipped[0].reason, skipped[0].reason
    latest.unlink()
    latest.write_bytes(b"step_00000010" + b" " * 10_000)
    assert store.latest_name() is None and "over 256 bytes" in store.latest_text()

    manifest = folder / MANIFEST
    manifest.rename(tmp_path / "real-manifest.json")
    os.mkfifo(manifest)
    assert "not a regular file" in store.inspect(folder).reason
    manifest.unlink()
    (tmp_path / "real-manifest.json").rename(manifest)
    os.mkfifo(folder / "listed.pt")  # a listed file that is a FIFO would hang its sha256
    data = json.loads(manifest.read_text())
    data["files"]["listed.pt"] = {"size": 0, "sha256": "0" * 64}
    manifest.write_text(json.dumps(data))
    assert "listed.pt is a FIFO; allowed: regular files" in store.inspect(folder).reason
