"""Export (safetensors, ONNX, parity) from either engine's checkpoints, and the workspace's model registry."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from toolkit.data import corpus as data_mod
from toolkit.train.models import loss_function
from toolkit.catalogue.data_assets import DataAssetError
from toolkit.deploy.export import MANIFEST, ExportError, export_run, read_manifest
from toolkit.catalogue.model_registry import get_model, list_models, register_model, resolve_model_dir
from toolkit.rundir import RunDir
from toolkit.catalogue.workspace import Workspace

from conftest import NO_CHECKPOINT, cli
from test_checkpoint import CKPT, DEEPSPEED_ZERO2_2, DEEPSPEED_ZERO3_2

FILES = {"config.yaml", "model.onnx", "model.safetensors", "parity.json", "tokenizer.json", "tokenizer_config.json",
         MANIFEST}


def assert_no_machine_paths(onnx_file) -> None:
    """The exporter's per-node stack traces name the exporting machine's source files (/home/alice/...): a shipped
    graph must not, and the same weights exported from another checkout must be the same bytes (the same version)."""
    data = onnx_file.read_bytes()
    assert b"pkg.torch.onnx.stack_trace" not in data and str(Path(torch.__file__).parent).encode() not in data
    assert str(Path(__file__).resolve().parents[2]).encode() not in data


def _val_loss_of_export(model_dir, run: RunDir) -> float:
    """The exported weights' loss on the run's own validation batches, computed the way the trainer does."""
    from toolkit.deploy.serving.runtimes import TorchRuntime

    cfg = run.read_config()
    corpus = data_mod.load_corpus(cfg)
    model = TorchRuntime(model_dir).model
    loss_fn = loss_function(cfg.model)
    with torch.no_grad():
        losses = [loss_fn(model, batch).item() for batch in data_mod.val_batches(corpus, cfg, 0, 1)]
    return sum(losses) / len(losses)


def _trained(train_tiny, *flags, name="run"):
    proc, run = train_tiny("--set", "train.max_steps=20", "--set", "train.eval_every=20", *flags, name=name)
    assert proc.returncode == 0, proc.stderr
    return run


@pytest.fixture
def trained(finished_run_copy) -> RunDir:
    """``_trained`` without flags: this test's own copy of a run trained once and shared."""
    return finished_run_copy("--set", "train.max_steps=20", "--set", "train.eval_every=20")


def test_export_writes_weights_onnx_and_a_parity_report_from_the_latest_checkpoint(trained):
    run = trained
    result = export_run(run.path)
    assert {p.name for p in result.path.iterdir()} == FILES and result.path == run.path / "model"
    manifest = read_manifest(result.path)
    assert manifest["checkpoint"] == "step_00000020" and manifest["engine"] == "torch"
    assert manifest["onnx_opset"] >= 17 and manifest["dynamic_axes"] == ["batch", "sequence"]
    assert manifest["files"]["model.safetensors"]["size"] == (result.path / "model.safetensors").stat().st_size
    assert_no_machine_paths(result.path / "model.onnx")
    parity = json.loads((result.path / "parity.json").read_text())
    assert result.parity_ok and parity["max_abs_diff"] <= 1e-4
    assert [s["shape"] for s in parity["shapes"]] == [[4, 32], [3, 17], [1, 1]], "several batch and sequence sizes"
    # safetensors is a JSON header and raw tensors: nothing in it can run code when loaded
    header_len = int.from_bytes((result.path / "model.safetensors").read_bytes()[:8], "little")
    assert json.loads((result.path / "model.safetensors").read_bytes()[8:8 + header_len])
    # the exported weights are the trained ones: same validation loss as the run's last evaluation
    assert _val_loss_of_export(result.path, run) == pytest.approx(run.events("eval")[-1]["val_loss"], abs=1e-5)


def test_export_replaces_an_older_export_whole_and_the_cli_reports_parity(trained, tmp_path):
    run = trained
    older = export_run(run.path).path
    # an older exporter's extra file (ONNX external weights), listed by its manifest: replaced with the folder
    (older / "model.onnx.data").write_bytes(b"external weights")
    manifest = json.loads((older / MANIFEST).read_text())
    manifest["files"]["model.onnx.data"] = {"size": 16, "sha256": hashlib.sha256(b"external weights").hexdigest()}
    (older / MANIFEST).write_text(json.dumps(manifest))
    proc = cli("export", str(run.path), "--register", "--workspace", str(tmp_path / "ws"))
    assert proc.returncode == 0, proc.stderr
    assert "parity        max |torch - onnxruntime|" in proc.stdout and "registered    tiny:1" in proc.stdout
    assert {p.name for p in (run.path / "model").iterdir()} == FILES
    assert not [p for p in run.path.iterdir() if p.name.startswith(".model")], "no temporary folder left behind"


def test_a_lineage_too_big_for_the_manifest_is_refused_and_nothing_is_written(trained):
    # a copied run's lineage.json whose data record (copied into the manifest) would make a manifest that serve and
    # register refuse: refused before anything is published, not written as an export nobody can read or replace
    lineage = json.loads(trained.lineage_path.read_text())
    lineage["data"]["name"] = "x" * (2 << 20)
    trained.lineage_path.write_text(json.dumps(lineage))
    before = sorted(p.name for p in trained.path.iterdir())
    proc = cli("export", str(trained.path))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert re.search(r"the manifest would be 2,\d{3},\d{3} bytes, over the 1,048,576 bytes its readers accept; its "
                     r"provenance 'data' \(the run's lineage.json\) is 2,\d{3},\d{3} bytes of it", proc.stderr), proc.stderr
    assert sorted(p.name for p in trained.path.iterdir()) == before, "no export, no staging folder left behind"


def test_a_run_without_checkpoints_cannot_be_exported(finished_run_copy):
    run = finished_run_copy(*NO_CHECKPOINT)
    with pytest.raises(ExportError, match="has no valid checkpoint"):
        export_run(run.path)
    proc = cli("export", str(run.path))
    assert proc.returncode == 2 and "error: run_dir:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (run.path / "model").exists()


@pytest.mark.slow
@pytest.mark.parametrize("stage, layout", [(2, DEEPSPEED_ZERO2_2), (3, DEEPSPEED_ZERO3_2)], ids=["2", "3"])
def test_zero_partitioned_checkpoints_are_consolidated(finished_run_copy, stage, layout):
    run = finished_run_copy(*CKPT, *layout, name=f"zero{stage}")  # a copy of the shared uninterrupted run of that layout
    result = export_run(run.path)
    assert result.manifest["engine"] == "deepspeed" and result.manifest["zero_stage"] == stage
    assert result.parity_ok
    # Consolidated fp32 weights from both ranks' partitions reproduce the run's own validation loss.
    assert _val_loss_of_export(result.path, run) == pytest.approx(run.events("eval")[-1]["val_loss"], abs=1e-4)


def test_models_register_by_content_with_their_lineage(train_tiny, finished_runs, tmp_path):
    ws_dir = tmp_path / "ws"
    assert cli("data", "--workspace", str(ws_dir), "register-builtin", "pydoc").returncode == 0
    run = _trained(train_tiny, "--set", "data.asset=pydoc", "--set", f"data.workspace={ws_dir}")
    ws = Workspace.open(ws_dir)
    first = register_model(ws, export_run(run.path).path)
    assert first.ref == "tiny:1" and first.data == "pydoc:1" and len(first.data_sha256) == 64
    assert first.run_dir == str(run.path.resolve()) and first.checkpoint == "step_00000020"
    assert register_model(ws, run.path / "model").ref == "tiny:1", "same content, same version"
    again = register_model(ws, export_run(run.path).path, description="re-exported")
    assert again == first, "exporting the same checkpoint again (a new manifest time) is the same version"
    other = export_run(finished_runs().path, out=tmp_path / "other")  # the suite's shared 40-step run
    second = register_model(ws, other.path, description="other weights")
    assert second.ref == "tiny:2" and get_model(ws, "tiny").ref == "tiny:2" and get_model(ws, "tiny:1") == first
    assert (first.path / "model.onnx").is_file() and first.path != run.path / "model", "served from the snapshot"
    assert [m.ref for m in list_models(ws)] == ["tiny:2", "tiny:1"]
    assert resolve_model_dir("tiny:1", ws_dir) == first.path
    listing = cli("models", "--workspace", str(ws_dir)).stdout
    assert "tiny:1" in listing and "pydoc:1" in listing


@pytest.mark.parametrize("ref, message", [
    ("nothing", "model: 'nothing' is not registered; registered: none"),
    ("bad/path/to/model", "model: 'bad/path/to/model' is neither a folder nor a registered model"),
    ("tiny:x", "model: 'tiny:x' is not a reference"),
])
def test_unknown_models_are_named(tmp_path, ref, message):
    with pytest.raises(DataAssetError, match=message.replace("(", r"\(")):
        resolve_model_dir(ref, tmp_path / "ws")


def test_a_folder_that_is_not_an_export_is_refused(tmp_path):
    (tmp_path / "weights").mkdir()
    with pytest.raises(ExportError, match="is not an exported model folder"):
        read_manifest(tmp_path / "weights")


def test_a_tampered_export_is_neither_registered_nor_served(trained, tmp_path):
    model = export_run(trained.path).path
    weights = bytearray((model / "model.safetensors").read_bytes())
    weights[-1] ^= 0x01  # one bit of one weight: the manifest's sha256 no longer matches
    (model / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(ExportError, match="model.safetensors"):
        register_model(Workspace.open(tmp_path / "ws"), model)
    assert list_models(Workspace.open(tmp_path / "ws")) == []
    served = cli("serve", str(model), "--workspace", str(tmp_path / "ws"))
    assert served.returncode == 2 and "model.safetensors" in served.stderr, served.stderr


def test_a_registered_snapshot_swapped_for_another_export_is_not_served_as_that_version(trained, finished_runs,
                                                                                      tmp_path):
    """Replacing a snapshot's files and manifest together (nothing written through a link, every hash consistent)
    still does not pass: the catalogue names the version's payload, and the manifest must be that payload."""
    ws = Workspace.open(tmp_path / "ws")
    first = register_model(ws, export_run(trained.path).path)
    other = export_run(finished_runs().path, out=tmp_path / "other").path  # other weights: the shared 40-step run
    for name in ("model.onnx", "model.safetensors", MANIFEST):
        (first.path / name).unlink()
        shutil.copyfile(other / name, first.path / name)
    with pytest.raises(DataAssetError, match=r"tiny:1's snapshot .* is not the registered version"):
        resolve_model_dir("tiny:1", tmp_path / "ws")
