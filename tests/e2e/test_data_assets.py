"""The local workspace catalogue and data assets: versions, snapshots, archive, concurrency, bad input."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from toolkit.catalogue import data_assets, data_store
from toolkit.catalogue.data_assets import DataAssetError
from toolkit.catalogue.workspace import SCHEMA_VERSION, Workspace, WorkspaceError

from conftest import TEN_STEPS, cli


pytestmark = pytest.mark.usefixtures("private_cache")  # each test reads and writes token files of its own


def test_workspace_is_created_with_the_current_schema(tmp_path):
    ws = Workspace.open(tmp_path / "new")
    assert ws.db_path.is_file() and ws.datastore.is_dir()
    assert ws.schema_version() == SCHEMA_VERSION
    assert Workspace.open(tmp_path / "new").schema_version() == SCHEMA_VERSION  # reopening migrates nothing


def test_a_workspace_from_a_newer_trainbook_is_refused(tmp_path):
    ws = Workspace.open(tmp_path / "ws")
    conn = sqlite3.connect(ws.db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 5}")
    conn.close()
    with pytest.raises(WorkspaceError, match=f"schema version {SCHEMA_VERSION + 5}, this Trainbook knows up to"):
        Workspace.open(tmp_path / "ws")
    (tmp_path / "afile").write_text("x")
    with pytest.raises(WorkspaceError, match="is a file; allowed: a folder"):
        Workspace.open(tmp_path / "afile")


def test_versions_follow_content_and_snapshots_never_change(ws, tmp_path):
    src = tmp_path / "corpus.txt"
    src.write_text("first")
    v1 = data_assets.register(ws, "corpus", src, type="uri_file", description="d", tags={"lang": "en"})
    assert (v1.ref, v1.size_bytes, v1.file_count) == ("corpus:1", 5, 1)
    assert data_assets.register(ws, "corpus", src, type="uri_file").ref == "corpus:1"  # same content
    src.write_text("second, longer")
    v2 = data_assets.register(ws, "corpus", src, type="uri_file")
    assert v2.ref == "corpus:2" and v2.sha256 != v1.sha256
    assert v1.path.read_text() == "first", "a registered version must not change when its source does"
    assert not os.access(v1.path, os.W_OK) or os.geteuid() == 0  # read-only blob (root may still write)
    assert data_assets.get(ws, "corpus").ref == "corpus:2"
    assert data_assets.get(ws, "corpus:1").tags == {"lang": "en"}


def test_folders_hash_names_and_contents(ws, tmp_path):
    folder = tmp_path / "images"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"\x00" * 100)
    (folder / "sub" / "b.bin").write_bytes(b"\x01" * 50)
    v1 = data_assets.register(ws, "images", folder)
    assert (v1.ref, v1.file_count, v1.size_bytes) == ("images:1", 2, 150)
    assert (v1.path / "sub" / "b.bin").read_bytes() == b"\x01" * 50
    (folder / "a.bin").rename(folder / "renamed.bin")
    assert data_assets.register(ws, "images", folder).ref == "images:2", "a rename is new content"
    v2 = data_assets.get(ws, "images:2")
    listing_bytes = (ws.datastore / "listings" / f"{v2.sha256}.json").read_bytes()
    assert hashlib.sha256(listing_bytes).hexdigest() == v2.sha256, "the listing's own hash is the content hash"
    kind, listing = json.loads(listing_bytes)
    assert kind == "uri_folder" and sorted(e["name"] for e in listing) == ["renamed.bin", "sub/b.bin"]
    in_snapshot = sorted(p.relative_to(v2.path).as_posix() for p in v2.path.rglob("*") if p.is_file())
    assert in_snapshot == ["renamed.bin", "sub/b.bin"], "a snapshot holds exactly the user's files"


def test_archive_hides_but_keeps_resolving(ws, tmp_path):
    src = tmp_path / "t.txt"
    for text in ("one", "two"):
        src.write_text(text)
        data_assets.register(ws, "t", src, type="uri_file")
    archived = data_assets.archive(ws, "t:2")
    assert archived.archived
    assert data_assets.get(ws, "t").ref == "t:1"  # latest not archived
    assert data_assets.get(ws, "t:2").path.read_text() == "two"  # old runs stay reproducible
    assert [a.ref for a in data_assets.list_assets(ws)] == ["t:1"]
    assert [a.ref for a in data_assets.list_assets(ws, include_archived=True)] == ["t:2", "t:1"]
    with pytest.raises(DataAssetError, match="names no version"):
        data_assets.archive(ws, "t")


@pytest.mark.parametrize("call, message", [
    (lambda ws, p: data_assets.register(ws, "bad name", p / "f.txt", type="uri_file"), r"name: 'bad name' is not allowed"),
    (lambda ws, p: data_assets.register(ws, "x", p / "f.txt", type="csv"), r"type: 'csv' is not allowed; allowed: uri_file"),
    (lambda ws, p: data_assets.register(ws, "x", p / "missing", type="uri_file"), r"path: '.*missing' does not exist"),
    (lambda ws, p: data_assets.register(ws, "x", p, type="uri_file"), r"is not a file; allowed: a single file \(type uri_file\)"),
    (lambda ws, p: data_assets.register(ws, "x", p / "f.txt", type="uri_folder"), r"is not a folder; allowed: a folder \(type uri_folder\)"),
    (lambda ws, p: data_assets.register(ws, "x", p, type="mltable"), r"has no MLTable file"),
    (lambda ws, p: data_assets.register(ws, "x", p / "f.txt", type="uri_file", tags={"k": 1}), r"tags: .* strings to strings"),
    (lambda ws, p: data_assets.get(ws, "x:0"), r"'x:0' is not a reference"),
    (lambda ws, p: data_assets.get(ws, "x:abc"), r"'x:abc' is not a reference"),
    (lambda ws, p: data_assets.get(ws, "nothing"), r"'nothing' is not registered; no asset has that name"),
    (lambda ws, p: data_assets.register(ws, "a/b", p), r"name: 'a/b' is not allowed"),
    (lambda ws, p: data_assets.register(ws, "..", p), r"name: '\.\.' is not allowed"),
    (lambda ws, p: data_assets.register(ws, "x" * 256, p), r"name: 'x{199}\.\.\. \(258 characters\) is not allowed"),
    (lambda ws, p: data_assets.register(ws, "x", p / "empty"), r"is an empty folder"),
    (lambda ws, p: data_assets.register(ws, "x", p / "linked"), r"is a link to .*outside"),
    (lambda ws, p: data_assets.register(ws, "x", p / "badtable", type="mltable"), r"do not match its MLTable"),
    # a FIFO would block the reader forever (an MLTable naming one hung `data register`); a name with a backslash
    # could be stored but never read back from its listing
    (lambda ws, p: data_assets.register(ws, "x", p / "withfifo"), r"pipe' is a FIFO; allowed: regular files and folders"),
    (lambda ws, p: data_assets.register(ws, "x", p / "fifotable", type="mltable"), r"more.csv' is a FIFO"),
    (lambda ws, p: data_assets.register(ws, "x", p / "backslash"), r"a\\\\b.txt' cannot be listed by its name"),
])
def test_bad_input_is_refused_and_nothing_is_recorded(ws, tmp_path, call, message):
    data = tmp_path / "data"
    data.mkdir()
    (data / "f.txt").write_text("x")
    (data / "empty").mkdir()
    (data / "linked").mkdir()
    (tmp_path / "secret.txt").write_text("outside")
    (data / "linked" / "ok.txt").write_text("inside")
    (data / "linked" / "escape.txt").symlink_to(tmp_path / "secret.txt")
    (data / "badtable").mkdir()
    (data / "badtable" / "t.csv").write_text("a,label\nnot-a-number,1\n")
    (data / "badtable" / "MLTable").write_text(
        "type: mltable\npaths:\n  - file: ./t.csv\ntransformations:\n  - read_delimited: {delimiter: ','}\n"
        "  - convert_column_types:\n      - {columns: a, column_type: int}\n")
    for name in ("withfifo", "fifotable", "backslash"):
        (data / name).mkdir()
        (data / name / "ok.csv").write_text("a,b\n1,2\n")
    os.mkfifo(data / "withfifo" / "pipe")
    os.mkfifo(data / "fifotable" / "more.csv")
    (data / "fifotable" / "MLTable").write_text(
        "type: mltable\npaths:\n  - file: ./ok.csv\n  - file: ./more.csv\ntransformations:\n"
        "  - read_delimited: {delimiter: ','}\n")
    (data / "backslash" / "a\\b.txt").write_text("x")
    with pytest.raises(DataAssetError, match=message):
        call(ws, data)
    assert data_assets.list_assets(ws, include_archived=True) == []
    assert not list((ws.datastore / "snapshots").glob("*")) if (ws.datastore / "snapshots").exists() else True


def test_links_inside_the_folder_are_snapshotted_as_files(ws, tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "real.txt").write_text("data")
    (folder / "alias.txt").symlink_to(folder / "real.txt")
    asset = data_assets.register(ws, "d", folder)
    assert asset.file_count == 2 and not (asset.path / "alias.txt").is_symlink()
    assert (asset.path / "alias.txt").read_text() == "data"


@pytest.mark.parametrize("swapped", ["the file", "a folder on its path"])
def test_a_file_swapped_for_a_link_after_the_check_is_refused_and_never_stored(ws, tmp_path, swapped):
    # Registration lists and checks the files (files_of), then reads them (store_snapshot). In between, the folder
    # may change: a file, or a folder above it, replaced by a link out of the folder must not bring the outside
    # file's bytes into the store.
    folder, outside = tmp_path / "d", tmp_path / "outside"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "notes.txt").write_text("mine")
    outside.mkdir()
    (outside / "notes.txt").write_text("SECRET OF SOMEONE ELSE")
    root = folder.resolve()
    files = data_store.files_of(root, "uri_folder")
    if swapped == "the file":
        (folder / "sub" / "notes.txt").unlink()
        (folder / "sub" / "notes.txt").symlink_to(outside / "notes.txt")
        message = r"sub/notes.txt' became a symbolic link to '.*/outside/notes.txt' while it was read"
    else:
        shutil.rmtree(folder / "sub")
        (folder / "sub").symlink_to(outside)
        message = r"sub/notes.txt' led to '.*/outside/notes.txt' when it was read"
    with pytest.raises(DataAssetError, match=message):
        data_store.store_snapshot(ws, files, "uri_folder", root=root)
    stored = [b.read_bytes() for b in (ws.datastore / "blobs").iterdir()]
    assert not any(b"SECRET" in data for data in stored)


def test_a_blob_is_restored_from_a_source_file_that_links_inside_its_folder(ws, tmp_path):
    # `data verify --repair` reads a registered folder's file again; a link to the folder's own file, which
    # registration took as that file, restores its blob too (only bytes that hash to the blob are ever stored)
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "real.txt").write_bytes(b"R" * 100)
    (folder / "alias.txt").symlink_to("real.txt")
    (ws.datastore / "blobs").mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(b"R" * 100).hexdigest()
    assert data_store.restore_blob(ws, digest, folder / "alias.txt") is None
    assert (ws.datastore / "blobs" / digest).read_bytes() == b"R" * 100


def test_an_interrupted_registration_leaves_the_catalogue_consistent(ws, tmp_path):
    import signal
    import time

    folder = tmp_path / "big"
    folder.mkdir()
    for i in range(3000):
        (folder / f"f{i:05d}.bin").write_bytes(os.urandom(2048))
    code = ("import sys; from toolkit.catalogue import data_assets; from toolkit.catalogue.workspace import Workspace; "
            "data_assets.register(Workspace.open(sys.argv[1]), 'big', sys.argv[2])")
    proc = subprocess.Popen([sys.executable, "-c", code, str(ws.root), str(folder)])
    blobs = ws.datastore / "blobs"
    deadline = time.monotonic() + 60
    # kill it once it is visibly half-way: some blobs written, nothing registered yet
    while time.monotonic() < deadline and proc.poll() is None:
        if blobs.exists() and len(os.listdir(blobs)) > 100:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)  # a directory has no "file count reached N" event to wait on
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the registration finished before it could be interrupted"
    assert data_assets.list_assets(ws, include_archived=True) == []
    asset = data_assets.register(ws, "big", folder)  # the retry completes, reusing the blobs already written
    assert asset.ref == "big:1" and asset.file_count == 3000
    assert all((asset.path / f"f{i:05d}.bin").read_bytes() == (folder / f"f{i:05d}.bin").read_bytes()
               for i in range(0, 3000, 250))


def test_unknown_version_lists_the_known_ones(ws, tmp_path):
    (tmp_path / "f").write_text("x")
    data_assets.register(ws, "f", tmp_path / "f", type="uri_file")
    with pytest.raises(DataAssetError, match="'f:7' is not registered; versions of f: f:1"):
        data_assets.get(ws, "f:7")


def _register_in_process(args):
    ws_path, path = args
    from toolkit.catalogue import data_assets as da
    from toolkit.catalogue.workspace import Workspace as W

    return da.register(W.open(ws_path), "shared", path, type="uri_file").ref


def test_concurrent_registration_loses_nothing_and_never_reuses_a_version(ws, tmp_path):
    # 8 processes at once, 4 distinct contents (the same file name in 8 folders): exactly 4 versions must exist,
    # numbered 1..4, and the two processes that registered the same content must get the same version.
    paths = []
    for i in range(8):
        folder = tmp_path / f"src{i}"
        folder.mkdir()
        (folder / "part.txt").write_text(f"content {i % 4}")
        paths.append(str(folder / "part.txt"))
    # an executor, not a Pool: a child that dies (an import error in the spawned interpreter) fails the test at
    # once (BrokenProcessPool), where a Pool replaces the child and waits for its lost task forever
    with ProcessPoolExecutor(8, mp_context=multiprocessing.get_context("spawn")) as pool:
        refs = list(pool.map(_register_in_process, [(str(ws.root), p) for p in paths]))
    assets = data_assets.list_assets(ws, name="shared")
    assert sorted(a.version for a in assets) == [1, 2, 3, 4], [a.ref for a in assets]
    assert all(refs[i] == refs[i + 4] for i in range(4)), refs
    assert len(set(refs)) == 4


def test_data_cli(tmp_path):
    src = tmp_path / "notes.txt"
    src.write_text("hello")
    ws = str(tmp_path / "ws")
    proc = cli("data", "--workspace", ws, "register", "notes", str(src), "--type", "uri_file", "--tag", "team=ml",
               "--description", "a note")
    assert proc.returncode == 0 and proc.stdout.strip() == "notes:1", proc.stderr
    listing = cli("data", "--workspace", ws, "list").stdout
    assert "notes:1" in listing and "team=ml" in listing
    shown = cli("data", "--workspace", ws, "show", "notes").stdout
    assert "sha256" in shown and "a note" in shown
    assert cli("data", "--workspace", ws, "archive", "notes:1").stdout.strip() == "archived notes:1"
    assert "notes:1" not in cli("data", "--workspace", ws, "list").stdout
    bad = cli("data", "--workspace", ws, "register", "notes", str(tmp_path / "nope"), "--type", "uri_file")
    assert bad.returncode == 2 and "error: path:" in bad.stderr and "does not exist" in bad.stderr
    bad = cli("data", "--workspace", ws, "register", "n", str(src), "--type", "uri_file", "--tag", "oops")
    assert bad.returncode == 2 and "--tag: 'oops' is not allowed" in bad.stderr
    typed = cli("data", "register", "single", str(src), "--workspace", ws)  # no --type: a file is a uri_file
    assert typed.returncode == 0 and "type uri_file (from the path" in typed.stderr, typed.stderr
    shown = json.loads(cli("data", "show", "single:1", "--json", "--workspace", ws).stdout)
    assert shown["ref"] == "single:1" and shown["type"] == "uri_file" and shown["size_bytes"] == 5


def test_looking_at_a_workspace_that_does_not_exist_creates_nothing_and_says_what_to_do(tmp_path):
    ws = tmp_path / "nothing-here"
    for argv, hint in ((["data", "list"], "trainbook data register-builtin"), (["runs"], "trainbook train demo"),
                       (["models"], "trainbook export RUN_DIR --register NAME")):
        proc = cli(*argv, "--workspace", str(ws))
        assert proc.returncode == 0 and f"workspace: {ws} (none yet)" in proc.stdout and hint in proc.stdout, proc
        assert json.loads(cli(*argv, "--workspace", str(ws), "--json").stdout)["workspace"] is None
    shown = cli("data", "show", "pydoc", "--workspace", str(ws))
    assert shown.returncode == 2 and "register data first" in shown.stderr, shown.stderr
    assert not ws.exists()


def test_builtin_assets_and_mltable_round_trip(ws):
    from toolkit.data.builtin import register_digits, register_pydoc
    from toolkit.data.corpus import pydoc_text
    from toolkit.catalogue.mltable import load_mltable

    pydoc = register_pydoc(ws)
    assert pydoc.ref == "pydoc:1" and pydoc.path.read_bytes() == pydoc_text()
    assert register_pydoc(ws).ref == "pydoc:1"  # shipped content does not change between calls
    digits = register_digits(ws)
    assert digits.type == "mltable" and (digits.path / "MLTable").is_file()
    frame = load_mltable(digits.path)
    assert frame.shape == (1797, 65) and str(frame["label"].dtype) == "int64" and frame["p10"].max() == 16


def test_training_on_registered_assets_pins_the_version(tmp_path, finished_runs):
    ws = str(tmp_path / "ws")
    assert cli("data", "--workspace", ws, "register-builtin").stdout.split() == ["pydoc:1", "stdlib:1", "digits:1"]
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "text"), "--set", "data.asset=pydoc",
               "--set", f"data.workspace={ws}", *TEN_STEPS)
    assert proc.returncode == 0, proc.stderr
    from toolkit.rundir import RunDir

    run = RunDir(tmp_path / "text")
    assert run.read_config().data.asset == "pydoc:1", "the latest version is pinned in the resolved config"
    lineage = json.loads(run.lineage_path.read_text())
    assert lineage["data"]["asset"]["ref"] == "pydoc:1" and len(lineage["data"]["asset"]["sha256"]) == 64
    # the same bytes as the built-in corpus, so the same losses as a run on the built-in dataset
    builtin = [e["loss"] for e in finished_runs(*TEN_STEPS).events("train")]  # test_training's, shared
    assert [e["loss"] for e in run.events("train")] == builtin and len(builtin) == 10

    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "table"), "--set", "data.asset=digits:1",
               "--set", f"data.workspace={ws}", "--set", "model.name=digits_mlp", "--set", "data.dataset=digits",
               "--set", "train.max_steps=30", "--set", "optim.lr=0.01", "--set", "optim.min_lr=0.001",
               "--set", "train.batch_size=64", "--set", "model.n_embd=64")
    assert proc.returncode == 0, proc.stderr
    evals = RunDir(tmp_path / "table").events("eval")
    assert evals[-1]["val_loss"] < 1.5, evals  # chance is ln(10) = 2.30


@pytest.mark.parametrize("flags, message", [
    (["--set", "data.asset=digits"], "data.asset: digits:1 is a mltable asset; allowed: uri_file, uri_folder (for model.name='gpt')"),
    (["--set", "data.asset=nothing"], "data asset: 'nothing' is not registered"),
    (["--set", "data.asset=pydoc:x"], "data.asset: 'pydoc:x' is not a reference"),
])
def test_bad_data_references_are_refused_before_the_run_starts(tmp_path, flags, message):
    ws = str(tmp_path / "ws")
    cli("data", "--workspace", ws, "register-builtin")
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", f"data.workspace={ws}", *flags)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_text_assets_are_tokenized_once_into_a_memory_mapped_file(ws, tmp_path):
    from toolkit import config as config_mod
    from toolkit.data import corpus as data_mod

    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "b.txt").write_bytes(b"B" * 500)
    (folder / "a.txt").write_bytes(b"A" * 500)
    asset = data_assets.register(ws, "texts", folder)
    cfg = config_mod.load("tiny", ["data.asset=texts:1", f"data.workspace={ws.root}", "model.block_size=16"])
    corpus = data_mod.load_corpus(cfg)
    cache = data_mod.token_file(asset)
    assert cache.read_bytes() == b"A" * 500 + b"\n\n" + b"B" * 500  # file-name order, joined once
    assert cache.is_relative_to(tmp_path / "cache") and asset.sha256 in cache.name, "keyed by content, in the cache"
    assert sorted(p.name for p in asset.path.iterdir()) == ["a.txt", "b.txt"], "nothing written into the snapshot"
    mtime = cache.stat().st_mtime_ns
    data_mod.load_corpus(cfg)
    assert cache.stat().st_mtime_ns == mtime, "the token file is built once per asset version"
    assert corpus.sha256 == asset.sha256 and corpus.asset["ref"] == "texts:1"


def test_ranks_draw_from_disjoint_shares():
    import numpy as np

    from toolkit.data import corpus as data_mod

    # each row's feature is its own id, so a batch says exactly which rows it drew
    corpus = data_mod.TableCorpus("ids", np.arange(1000, dtype=np.float32)[:, None], np.zeros(1000), 0.1)
    drawn = []
    for rank in (0, 1):
        batches = data_mod.StepBatches(corpus, 64, seed=1, rank=rank, world_size=2)
        drawn.append({int(v) for step in range(20) for v in batches[step]["inputs"].flatten()})
    assert drawn[0] and drawn[1] and not drawn[0] & drawn[1]
    assert len(drawn[0] | drawn[1]) > 800  # together they cover (nearly) all 900 training rows


def test_loading_advisor_measures_and_warns(tmp_path):
    ws = str(tmp_path / "ws")
    folder = tmp_path / "many" / "a" / "b" / "c" / "d"
    folder.mkdir(parents=True)
    text = (__import__("toolkit.data.corpus", fromlist=["pydoc_text"]).pydoc_text())
    for i in range(120):  # 120 small files, five folders deep: both traps of the guide
        (folder / f"part{i:03d}.txt").write_bytes(text[i * 2000:(i + 1) * 2000])
    assert cli("data", "--workspace", ws, "register", "many", str(tmp_path / "many")).returncode == 0
    proc = cli("data", "--workspace", ws, "tune", "many", "--config", "tiny", "--steps", "5")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "workers" in out and "wait %" in out and "loader batch/s" in out and out.count("\n  ") >= 4, out
    assert "120 of 120 files are under 4 MB" in out and "folders deep" in out, out
    assert "recommended" in out or "no setting met the target" in out


def test_shm_warning_when_workers_need_more_than_there_is(tmp_path):
    from toolkit.train.loading_advisor import layout_warnings

    (tmp_path / "f.txt").write_text("x")
    warnings = layout_warnings(tmp_path, num_workers=8, batch_bytes=1 << 40, prefetch=4)
    assert any("/dev/shm has" in w and "8 workers x prefetch 4" in w for w in warnings), warnings


def test_runs_are_indexed_with_the_data_they_used(tmp_path):
    ws = str(tmp_path / "my ws #2")  # --workspace keeps a path whole that a bare --set value would cut at " #"
    cli("data", "--workspace", ws, "register-builtin", "pydoc")
    for name, extra in (("on-asset", ["--set", "data.asset=pydoc", "--workspace", ws]),
                        ("builtin", ["--workspace", ws])):
        proc = cli("train", "tiny", "--run-dir", str(tmp_path / name), "--set", "train.max_steps=5", *extra)
        assert proc.returncode == 0, proc.stderr
    listing = cli("runs", "--workspace", ws).stdout
    assert str(tmp_path / "on-asset") in listing and "pydoc:1" in listing and "completed" in listing, listing
    assert "builtin:pydoc" in listing
    only = cli("runs", "--workspace", ws, "--data", "pydoc").stdout
    assert str(tmp_path / "on-asset") in only and str(tmp_path / "builtin") not in only, only


def test_an_unreadable_file_is_refused_and_nothing_is_recorded():
    """root reads a chmod-000 file anyway, so as root the registration runs as 'nobody' (setpriv), in a folder
    under /tmp that 'nobody' can reach (pytest's tmp_path is private to root)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="trainbook-unreadable-"))
    try:
        _register_unreadable(tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _register_unreadable(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "ok.txt").write_text("fine")
    (folder / "locked.txt").write_text("secret")
    (folder / "locked.txt").chmod(0o000)
    ws_path = tmp_path / "shared-ws"
    Workspace.open(ws_path)
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot make a file unreadable")
        for p in [tmp_path, *ws_path.rglob("*"), ws_path]:
            p.chmod(0o777 if p.is_dir() else 0o666)
        (folder / "locked.txt").chmod(0o000)
        prefix = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    code = ("import sys; from toolkit.catalogue import data_assets; from toolkit.catalogue.workspace import Workspace\n"
            "try:\n    data_assets.register(Workspace.open(sys.argv[1]), 'locked', sys.argv[2])\n"
            "except data_assets.DataAssetError as exc:\n    print(exc); sys.exit(3)\n")
    proc = subprocess.run([*prefix, sys.executable, "-c", code, str(ws_path), str(folder)], capture_output=True,
                          text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "locked.txt' cannot be read (Permission denied)" in proc.stdout
    assert data_assets.list_assets(Workspace.open(ws_path), include_archived=True) == []
