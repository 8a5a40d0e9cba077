"""The entry an Azure ML job runs: each process one rank under someone else's launcher, data read in place.

Azure ML's PyTorchDistribution starts every rank itself and mounts the data asset's uploaded snapshot
read-only; torchrun stands in for it here (it sets the same RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* variables).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from toolkit.catalogue import data_assets
from toolkit.data import corpus as data_mod
from toolkit.data.builtin import BUILTINS
from toolkit.ports import free_port_pair
from toolkit.rundir import RunDir

from conftest import PROJECT, cli


pytestmark = pytest.mark.usefixtures("private_cache")  # each test reads and writes token files of its own


@pytest.mark.parametrize("which", ["pydoc", "digits"])
def test_a_snapshot_read_in_place_has_the_registered_identity(ws, which):
    asset = BUILTINS[which](ws)
    opened = data_assets.open_path(asset.path)  # what the job sees: the uploaded snapshot, mounted
    assert (opened.type, opened.sha256, opened.size_bytes) == (asset.type, asset.sha256, asset.size_bytes)


def _texts(folder, files: dict[str, bytes]):
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_a_plain_folder_is_read_in_name_order(tmp_path):
    folder = _texts(tmp_path / "texts", {"b.txt": b"B" * 300, "a.txt": b"A" * 300})
    asset = data_assets.open_path(folder)
    assert asset.type == "uri_folder" and asset.file_count == 2
    assert data_mod.token_file(asset).read_bytes() == b"A" * 300 + b"\n\n" + b"B" * 300
    (folder / "a.txt").write_bytes(b"C" * 300)
    assert data_assets.open_path(folder).sha256 != asset.sha256, "the hash follows the contents"
    assert sorted(p.name for p in folder.iterdir()) == ["a.txt", "b.txt"], "nothing is written into the data"


def test_two_files_of_one_folder_train_on_their_own_tokens(tmp_path):
    from toolkit import config as config_mod

    texts = {"one.txt": b"first file " * 40, "two.txt": b"SECOND FILE, other bytes " * 30}
    folder = _texts(tmp_path / "texts", texts)
    token_files = {}
    for name, data in texts.items():  # one after the other as data.path, as two runs would
        cfg = config_mod.load("tiny", [f"data.path={folder / name}", "model.block_size=16"])
        corpus = data_mod.load_corpus(cfg)
        assert bytes(corpus.splits["train"].numpy()) + bytes(corpus.splits["val"].numpy()) == data, name
        assert corpus.asset["sha256"] == data_assets.open_path(folder / name).sha256
        token_files[name] = data_mod.token_file(data_assets.open_path(folder / name))
        assert token_files[name].read_bytes() == data
    assert token_files["one.txt"] != token_files["two.txt"]
    assert sorted(p.name for p in folder.iterdir()) == ["one.txt", "two.txt"], "nothing is written into the data"


def test_a_file_changed_after_hashing_is_refused_not_cached(tmp_path):
    folder = _texts(tmp_path / "texts", {"a.txt": b"A" * 300, "b.txt": b"B" * 300})
    asset = data_assets.open_path(folder)
    (folder / "b.txt").write_bytes(b"X" * 300)  # changed between hashing (lineage) and reading (training)
    with pytest.raises(data_assets.DataAssetError, match=r"b\.txt.* changed after it was hashed"):
        data_mod.token_file(asset)
    assert not (tmp_path / "cache").exists() or not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]
    fresh = data_assets.open_path(folder)
    assert data_mod.token_file(fresh).read_bytes() == b"A" * 300 + b"\n\n" + b"X" * 300


def test_a_read_only_input_gets_its_token_file_in_the_cache(tmp_path, monkeypatch, small_mount):
    source = tmp_path / "src"
    source.mkdir()
    (source / "corpus.txt").write_bytes(b"read-only bytes " * 40)
    # A read-only bind mount, as Azure ML's ro_mount gives a job.
    with small_mount("--bind", "-o", "ro", str(source)) as mount:
        monkeypatch.setenv("TRAINBOOK_CACHE", str(tmp_path / "cache"))
        asset = data_assets.open_path(mount / "corpus.txt")
        cache = data_mod.token_file(asset)
        assert cache.is_relative_to(tmp_path / "cache") and cache.read_bytes() == b"read-only bytes " * 40
        assert sorted(p.name for p in mount.iterdir()) == ["corpus.txt"]


@pytest.mark.parametrize("flags, message", [
    (["--set", "data.path=/nonexistent/corpus.txt"], "data.path: '/nonexistent/corpus.txt' does not exist"),
    (["--set", "data.path=/tmp", "--set", "data.asset=pydoc"], "data.path: '/tmp' given together with data.asset"),
    (["--set", "data.path={tmp}/fifo"], "path: '{tmp}/fifo' is a FIFO; allowed: a regular file or a folder"),
])
def test_bad_data_paths_are_refused_before_the_run_starts(tmp_path, flags, message):
    os.mkfifo(tmp_path / "fifo")  # a reader would wait on it forever
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *[flag.format(tmp=tmp_path) for flag in flags],
               timeout=60)
    assert proc.returncode == 2 and message.format(tmp=tmp_path) in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_table_path_is_refused_for_the_text_model(ws, tmp_path):
    table = BUILTINS["digits"](ws).path
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", f"data.path={table}")
    assert proc.returncode == 2 and "is a mltable asset; allowed: uri_file, uri_folder (for model.name='gpt')" in proc.stderr


@pytest.mark.slow
def test_the_job_entry_of_one_node_creates_the_run_trains_and_a_retry_continues_it(ws, tmp_path):
    asset = BUILTINS["pydoc"](ws)
    run_dir = tmp_path / "outputs" / "run"
    cmd = [sys.executable, "-m", "toolkit.runs.job", str(run_dir), "--config", "tiny", "--nnodes", "1",
           "--set", f"data.path={asset.path}", "--set", "engine.nproc=2", "--set", "train.max_steps=12"]
    proc = subprocess.run([*cmd, "--master-port", str(free_port_pair())], capture_output=True, text=True,
                          cwd=PROJECT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunDir(run_dir)
    assert run.read_status()["state"] == "completed" and run.read_status()["step"] == 12
    lineage = json.loads(run.lineage_path.read_text())
    assert lineage["world_size"] == 2
    assert lineage["data"]["asset"]["sha256"] == asset.sha256, "the job's lineage names the registered data"
    assert run.read_config().data.path == str(asset.path)

    # The same command again (Azure ML retrying the job) finds the run directory and continues, never clobbers it.
    again = subprocess.run([*cmd, "--master-port", str(free_port_pair())], capture_output=True, text=True,
                           cwd=PROJECT, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert run.read_status()["state"] == "completed"
    # Another config under the same run directory is refused, naming the field; the run is left as it was.
    other = subprocess.run([*cmd, "--set", "train.max_steps=16", "--master-port", str(free_port_pair())],
                           capture_output=True, text=True, cwd=PROJECT, timeout=300)
    assert other.returncode == 2 and "train.max_steps: 16 differs from the stored run's" in other.stderr, other.stderr[-2000:]
    assert run.read_config().train.max_steps == 12 and run.read_status()["state"] == "completed"


def test_an_elastic_range_past_the_largest_cluster_is_refused_at_once(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "toolkit.runs.job", str(tmp_path / "run"), "--config", "tiny",
                           "--nnodes", "1:1000000000000"], capture_output=True, text=True, cwd=PROJECT, timeout=60)
    assert proc.returncode == 2 and "--nnodes: '1:1000000000000' is not allowed" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()
