"""The model folder's owner (toolkit.catalogue.model_format) on real files: what a server may load, which folder an export
may replace, and publishing one in a single step. No training, no subprocess: a folder of placeholder bytes with
a manifest of their real sizes and hashes stands for an export."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from toolkit.fsio import remove_stale_staging, replace_in_two_steps, staging_folder
from toolkit.catalogue.model_format import (FORMAT, MANIFEST, ExportError, check_replaceable, publish_folder,
                                            verify_model_folder)
from toolkit.deploy.serving.options import check_runtime, served_tasks

FILES = ("model.onnx", "model.safetensors", "config.yaml", "tokenizer.json", "parity.json")


def _manifest(folder: Path, files=None, **fields) -> dict:
    listed = {name: {"sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest(),
                     "size": (folder / name).stat().st_size} for name in files or FILES}
    manifest = {"format": FORMAT, "model": "gpt", "block_size": 32, "files": listed, **fields}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return manifest


def _export(folder: Path, tag: str = "a") -> Path:
    folder.mkdir(parents=True)
    for name in FILES:
        (folder / name).write_bytes(f"{tag} {name} ".encode() * 50)
    _manifest(folder)
    return folder


def test_a_folder_as_exported_verifies_and_hidden_metadata_is_left_alone(tmp_path):
    folder = _export(tmp_path / "model")
    (folder / ".listing.json").write_text("[]")  # the registry's snapshot keeps its own listing beside the files
    assert verify_model_folder(folder)["files"].keys() == set(FILES)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("change, message", [
    (lambda f: _flip_a_byte(f / "model.onnx"), "has model.onnx whose sha256 differs from trainbook-model.json"),
    (lambda f: (f / "config.yaml").write_bytes(b"cut"),
     f"has config.yaml of 3 bytes, trainbook-model.json lists {len('a config.yaml ') * 50}"),
    (lambda f: (f / "tokenizer.json").unlink(), "lacks tokenizer.json, listed in trainbook-model.json"),
    (lambda f: (f / "model.onnx.data").write_bytes(b"weights"),
     "holds model.onnx.data, which trainbook-model.json does not list"),
    (lambda f: (f / "extra").mkdir(), "holds extra, which trainbook-model.json does not list"),
    (lambda f: ((f / "model.onnx").unlink(), (f / "model.onnx").symlink_to(f.parent / "elsewhere.onnx")),
     "holds model.onnx, a symbolic link"),
    (lambda f: (f / ".hidden").symlink_to("/etc"), "holds .hidden, a symbolic link"),
    (lambda f: ((f / "parity.json").unlink(), (f / "parity.json").mkdir()),
     "holds parity.json, listed in trainbook-model.json, which is not a regular file"),
    (lambda f: os.mkfifo(f / ".registry"), "holds .registry, a FIFO; allowed: regular files and plain subfolders"),
    (lambda f: ((f / ".meta").mkdir(), (f / ".meta" / "notes").symlink_to("/etc/hostname")),
     "holds .meta/notes, a symbolic link to '/etc/hostname'"),
], ids=["changed-byte", "other-size", "missing", "unlisted-file", "unlisted-folder", "listed-link", "hidden-link",
        "listed-folder", "hidden-fifo", "link-in-a-hidden-folder"])
def test_a_changed_folder_is_refused_naming_the_file(tmp_path, change, message):
    folder = _export(tmp_path / "model")
    (tmp_path / "elsewhere.onnx").write_bytes((folder / "model.onnx").read_bytes())  # same bytes, outside
    change(folder)
    with pytest.raises(ExportError, match=f"^model: '{folder}' {message}"):
        verify_model_folder(folder)


@pytest.mark.parametrize("name", ["../outside.bin", "/etc/hostname", "sub/model.onnx", ".hidden", "..", ""])
def test_a_listed_name_never_leaves_the_folder(tmp_path, name):
    folder = _export(tmp_path / "model")
    (tmp_path / "outside.bin").write_bytes(b"outside")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"][name] = {"sha256": "0" * 64, "size": 7}
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ExportError, match=f"lists {name!r}; allowed: plain file names inside the folder"):
        verify_model_folder(folder)


@pytest.mark.parametrize("files, message", [
    (["model.onnx"], "files \\['model.onnx'\\] in .* is not allowed"),
    ({}, "files {} in .* is not allowed"),
    ({"model.onnx": {"size": True, "sha256": "0" * 64}}, "lists 'model.onnx' as .*; allowed: {\"size\": bytes"),
    ({"model.onnx": {"size": 3, "sha256": "abc"}}, "lists 'model.onnx' as "),
], ids=["a-list", "empty", "bool-size", "short-hash"])
def test_a_manifest_that_does_not_say_size_and_sha256_is_refused(tmp_path, files, message):
    folder = _export(tmp_path / "model")
    (folder / MANIFEST).write_text(json.dumps({"format": FORMAT, "files": files}))
    with pytest.raises(ExportError, match=message):
        verify_model_folder(folder)


@pytest.mark.parametrize("content, message", [
    ("{not json", "trainbook-model.json' cannot be read"),
    ("[1, 2]", "holds a list, not an object"),
    (json.dumps({"format": "other-v9"}), "has format 'other-v9'; allowed: trainbook-model-v1"),
])
def test_an_unreadable_manifest_is_refused_in_one_line(tmp_path, content, message):
    folder = _export(tmp_path / "model")
    (folder / MANIFEST).write_text(content)
    with pytest.raises(ExportError, match=message):
        verify_model_folder(folder)


# --- which folder may be replaced ---------------------------------------------------------------------------------

def test_missing_empty_and_earlier_exports_may_be_replaced(tmp_path):
    check_replaceable(tmp_path / "new")
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty")
    check_replaceable(_export(tmp_path / "earlier"))


def _refusal(out: Path) -> str:
    with pytest.raises(ExportError) as caught:
        check_replaceable(out)
    return str(caught.value)


def test_anything_else_is_refused_naming_out_the_folder_and_what_is_allowed(tmp_path):
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    assert _refusal(mine) == (f"--out: '{mine}' exists and is not a model folder (no {MANIFEST}); allowed: a new or "
                              f"empty folder, or an earlier model folder (it holds {MANIFEST} and only the files that "
                              "lists; it is replaced)")
    (tmp_path / "a-file").write_text("x")
    assert "exists and is not a model folder" in _refusal(tmp_path / "a-file")
    faked = tmp_path / "faked"
    faked.mkdir()
    (faked / MANIFEST).symlink_to(_export(tmp_path / "real") / MANIFEST)  # a linked manifest does not make it ours
    assert "exists and is not a model folder" in _refusal(faked)


@pytest.mark.parametrize("target", ["an export", "nothing"])
def test_a_link_is_never_replaced_or_written_through(tmp_path, target):
    real = _export(tmp_path / "real") if target == "an export" else tmp_path / "missing"
    link = tmp_path / "model"
    link.symlink_to(real)
    assert _refusal(link) == (f"--out: '{link}' is a symbolic link; allowed: a real folder path (a link is never "
                              "written through or replaced)")


# --- publishing ----------------------------------------------------------------------------------------------------

def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _publish(out: Path, tag: str) -> None:
    with staging_folder(out) as tmp:
        for name in FILES:
            (tmp / name).write_text(f"{tag} {name}")
        _manifest(tmp)
        publish_folder(tmp, out)


def test_publishing_replaces_an_earlier_folder_whole_and_leaves_nothing_behind(tmp_path):
    out = tmp_path / "model"
    _publish(out, "first")
    (out / "model.onnx.data").write_text("an older exporter's external weights")  # listed by that export
    _manifest(out, files=[*FILES, "model.onnx.data"])
    _publish(out, "second")
    assert sorted(p.name for p in out.iterdir()) == sorted([*FILES, MANIFEST])
    assert (out / "config.yaml").read_text() == "second config.yaml" and verify_model_folder(out)
    assert _leftovers(tmp_path) == []


def test_failed_work_removes_its_staging_folder_and_leaves_the_earlier_export(tmp_path):
    out = tmp_path / "model"
    _publish(out, "first")
    with pytest.raises(RuntimeError, match="the ONNX exporter broke"), staging_folder(out) as tmp:
        (tmp / "model.onnx").write_text("half")
        raise RuntimeError("the ONNX exporter broke")
    assert (out / "config.yaml").read_text() == "first config.yaml" and _leftovers(tmp_path) == []


def test_a_foreign_folder_that_appears_during_the_work_is_not_replaced(tmp_path):
    out = tmp_path / "model"
    with pytest.raises(ExportError, match="exists and is not a model folder"), staging_folder(out) as tmp:
        (tmp / "config.yaml").write_text("new")
        out.mkdir()
        (out / "mine.txt").write_text("keep")
        publish_folder(tmp, out)
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and _leftovers(tmp_path) == []


def test_staging_folders_of_killed_publishers_are_removed_and_live_ones_kept(tmp_path):
    out = tmp_path / "model"
    stale = [tmp_path / ".model.0123456789abcdef.tmp", tmp_path / ".model.89abcdef.old"]
    for folder in stale:
        folder.mkdir()
        (folder / "model.onnx").write_text("half")
    not_ours = [tmp_path / ".model.notours.tmp", tmp_path / ".model.0123456789abcdee.tmp"]
    not_ours[0].mkdir()
    not_ours[1].symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep.txt").write_text("keep")
    with staging_folder(out) as live:  # holds its lock while it lives, as an export in progress does
        assert all(not folder.exists() for folder in stale)
        assert remove_stale_staging(out) == [] and live.is_dir(), "a live staging folder is never taken for stale"
    assert not live.exists(), "work that ends without publishing removes its staging folder"
    assert not_ours[0].is_dir() and not_ours[1].is_symlink() and (tmp_path / "elsewhere" / "keep.txt").exists()


def test_the_two_rename_fallback_keeps_the_previous_folder_until_the_new_one_is_in(tmp_path):
    """Where renameat2(RENAME_EXCHANGE) is missing: the previous folder moves to a hidden name first."""
    out, new = _export(tmp_path / "model", "old"), _export(tmp_path / ".model.fedcba9876543210.tmp", "new")
    old = replace_in_two_steps(new, out)
    assert old.name.startswith(".model.") and old.name.endswith(".old")
    assert (out / "config.yaml").read_bytes().startswith(b"new")
    assert (old / "config.yaml").read_bytes().startswith(b"old")
    assert remove_stale_staging(out) == [old.name] and verify_model_folder(out)


def test_a_folder_with_a_stray_manifest_beside_other_files_is_not_an_export(tmp_path):
    """A file named like the manifest does not make a folder ours: only a readable manifest listing everything the
    folder holds does (replacing the folder deletes what is in it)."""
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "sub" / "important.txt").write_text("precious")
    (victim / MANIFEST).write_text("{}")
    assert "exists and is not a model folder (model: " in _refusal(victim)
    earlier = _export(tmp_path / "earlier")
    (earlier / "notes.txt").write_text("mine, written into an export folder")
    assert "holds 'notes.txt', which a model folder does not" in _refusal(earlier)
    (earlier / "notes.txt").unlink()
    (earlier / "sub").mkdir()
    assert "holds 'sub', which a model folder does not" in _refusal(earlier)
    assert (victim / "sub" / "important.txt").read_text() == "precious"


# --- what a folder serves ------------------------------------------------------------------------------------------

def test_each_kind_of_export_serves_its_tasks_and_a_model_no_endpoint_serves_is_named():
    assert served_tasks({"model": "gpt"}) == ("generate", "score")
    assert served_tasks({"model": "hf", "task": "causal_lm"}) == ("generate", "score")
    assert served_tasks({"model": "hf", "task": "sequence_classification"}) == ("classify",)
    allowed = "allowed: gpt, hf (causal_lm), hf (sequence_classification)"
    with pytest.raises(ExportError, match=rf"^model: 'digits_mlp' cannot be served; {re.escape(allowed)}$"):
        served_tasks({"model": "digits_mlp"})
    with pytest.raises(ExportError, match=r"^model: 'hf \(token_classification\)' cannot be served"):
        served_tasks({"model": "hf", "task": "token_classification"})


def test_the_runtime_defaults_to_the_models_and_needs_its_weights(tmp_path):
    folder = _export(tmp_path / "model")
    gpt = verify_model_folder(folder)
    assert check_runtime(folder, gpt, None) == "onnx" and check_runtime(folder, gpt, "torch") == "torch"
    hf = _manifest(folder, model="hf", task="causal_lm")
    assert check_runtime(folder, hf, None) == "torch", "a transformers model generates with its KV cache on torch"
    with pytest.raises(ExportError, match=r"^runtime: 'tensorrt' is not allowed; allowed: onnx, torch$"):
        check_runtime(folder, hf, "tensorrt")

    # an architecture torch.onnx.export could not handle: exported without model.onnx, and the manifest says why
    (folder / "model.onnx").unlink()
    why = "torch.onnx.export failed: ValueError: Cannot handle batch sizes > 1 if no padding token is defined."
    no_onnx = _manifest(folder, [n for n in FILES if n != "model.onnx"], model="hf", task="causal_lm",
                        onnx_not_exported=why)
    assert check_runtime(folder, no_onnx, None) == "torch"
    with pytest.raises(ExportError) as refused:
        check_runtime(folder, no_onnx, "onnx")
    assert str(refused.value) == (f"model: '{folder}' has no model.onnx, which --runtime onnx loads (the export could "
                                  f"not write it: {why}); allowed: a folder with model.onnx, or --runtime torch")
