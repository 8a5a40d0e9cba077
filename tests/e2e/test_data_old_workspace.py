"""Workspaces made by the previous Trainbook keep working: their registered assets train on the registered bytes,
under the registered hash, and their snapshots move to the current layout the first time they are used.

The old workspace is built here file by file as the previous Trainbook wrote it (git show 2f1b102:
toolkit/catalogue/data_assets.py and toolkit/data/corpus.py), not by today's code: blobs/<sha256> read-only, a snapshot folder of
hard links to them plus `.listing.json` (the bare listing, indent=1, written in place) and, once it had trained,
`.tokens-bytes-v1.u8` (its token cache, written inside the snapshot); no listings/ folder; a catalogue row
pointing at the snapshot."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from toolkit.catalogue import data_assets, data_verify
from toolkit.catalogue.workspace import Workspace

from conftest import cli

TEXTS = {"a.txt": b"alpha " * 400, "sub/b.txt": b"beta, other bytes " * 150, "c.txt": b"gamma\n" * 300}


pytestmark = pytest.mark.usefixtures("private_cache")  # each test reads and writes token files of its own


def _old_workspace(root: Path, name: str, files: dict[str, bytes], type: str = "uri_folder") -> dict:
    """A workspace as the previous Trainbook left it after `data register NAME` and one training run; returns
    what was registered: the content hash, the snapshot folder and the bytes training must read."""
    Workspace.open(root)  # the catalogue schema did not change: the previous Trainbook made the same tables
    blobs, snapshots = root / "datastore" / "blobs", root / "datastore" / "snapshots"
    blobs.mkdir(parents=True)
    listing = []
    for rel in sorted(files):  # its _files_of: sorted(path.rglob("*"))
        digest = hashlib.sha256(files[rel]).hexdigest()
        blob = blobs / digest
        blob.write_bytes(files[rel])
        os.chmod(blob, 0o444)
        listing.append({"name": rel, "sha256": digest, "size": len(files[rel])})
    content = hashlib.sha256(json.dumps([type, listing], sort_keys=True).encode()).hexdigest()
    snapshot = snapshots / content
    for entry in listing:
        (snapshot / entry["name"]).parent.mkdir(parents=True, exist_ok=True)
        os.link(blobs / entry["sha256"], snapshot / entry["name"])
    (snapshot / ".listing.json").write_text(json.dumps(listing, indent=1))
    tokens = b"\n\n".join(files[rel] for rel in sorted(files))  # its token_file: file-name order
    (snapshot / ".tokens-bytes-v1.u8").write_bytes(tokens)
    rel_snapshot = f"datastore/snapshots/{content}" + (f"/{listing[0]['name']}" if type == "uri_file" else "")
    conn = sqlite3.connect(root / "catalogue.sqlite")
    with conn:
        conn.execute("INSERT INTO data_assets (name, version, type, sha256, size_bytes, file_count, created, source, "
                     "description, tags, snapshot) VALUES (?, 1, ?, ?, ?, ?, ?, ?, '', '{}', ?)",
                     (name, type, content, sum(e["size"] for e in listing), len(listing), time.time(),
                      f"/home/someone/{name}", rel_snapshot))
    conn.close()
    return {"content": content, "snapshot": snapshot, "tokens": tokens, "listing": listing}


def _files_in(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _cached(tmp_path) -> list[Path]:
    """The token files in the user cache (which also keeps the measured matmul peak)."""
    tokens = tmp_path / "cache" / "tokens"
    return [p for p in tokens.rglob("*") if p.is_file()] if tokens.exists() else []


def test_training_on_an_old_workspace_reads_the_registered_bytes_and_upgrades_the_snapshot(tmp_path):
    from toolkit.rundir import RunDir

    old = _old_workspace(tmp_path / "ws", "texts", TEXTS)
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "run"), "--set", "data.asset=texts",
               "--set", f"data.workspace={tmp_path / 'ws'}", "--set", "train.max_steps=4",
               "--set", "train.eval_every=4", "--set", "model.block_size=16")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lineage = json.loads(RunDir(tmp_path / "run").lineage_path.read_text())
    assert lineage["data"]["asset"] == {"ref": "texts:1", "sha256": old["content"], "type": "uri_folder"}
    assert lineage["data"]["sha256"] == old["content"]
    # trained on exactly the registered files, none of the old Trainbook's own
    assert [p.read_bytes() for p in _cached(tmp_path)] == [old["tokens"]]

    # the next user finds the current layout: exactly the user's files, the listing beside, verify clean, and a job
    # reading the snapshot in place (Azure ML mounts it) hashes it to the registered asset
    assert _files_in(old["snapshot"]) == TEXTS
    ws = Workspace.open(tmp_path / "ws")
    assert (ws.datastore / "listings" / f"{old['content']}.json").is_file()
    report = data_verify.verify(ws)
    assert report.ok, report.summary()
    assert data_assets.open_path(old["snapshot"]).sha256 == old["content"]


@pytest.mark.parametrize("type", ["uri_folder", "uri_file"])
def test_load_corpus_on_an_old_asset_needs_no_repair_step(tmp_path, type):
    from toolkit import config as config_mod
    from toolkit.data import corpus as data_mod

    files = TEXTS if type == "uri_folder" else {"corpus.txt": TEXTS["a.txt"]}
    old = _old_workspace(tmp_path / "ws", "old", files, type)
    cfg = config_mod.load("tiny", ["data.asset=old:1", f"data.workspace={tmp_path / 'ws'}", "model.block_size=16"])
    corpus = data_mod.load_corpus(cfg)
    assert corpus.asset["sha256"] == corpus.sha256 == old["content"]
    assert bytes(corpus.splits["train"].numpy()) + bytes(corpus.splits["val"].numpy()) == old["tokens"]
    assert _files_in(old["snapshot"]) == files, "the old Trainbook's files are gone from the snapshot"
    assert data_verify.verify(Workspace.open(tmp_path / "ws")).ok
    again = data_mod.load_corpus(cfg)  # the next use: already in the current layout, the same token file
    assert again.asset == corpus.asset and [p.read_bytes() for p in _cached(tmp_path)] == [old["tokens"]]


def test_an_old_asset_with_a_damaged_blob_says_what_is_wrong_and_what_to_do(tmp_path):
    from toolkit import config as config_mod
    from toolkit.data import corpus as data_mod

    old = _old_workspace(tmp_path / "ws", "texts", TEXTS)
    damaged = old["listing"][0]
    blob = tmp_path / "ws" / "datastore" / "blobs" / damaged["sha256"]
    with open(blob, "r+b") as f:  # what the old Trainbook's write through a hard link did: same inode, other bytes
        f.write(b"X")
    before = _files_in(old["snapshot"])
    cfg = config_mod.load("tiny", ["data.asset=texts:1", f"data.workspace={tmp_path / 'ws'}", "model.block_size=16"])
    with pytest.raises(data_assets.DataAssetError) as caught:
        data_mod.load_corpus(cfg)
    message = str(caught.value)
    assert "texts:1" in message and repr(damaged["name"]) in message and damaged["sha256"] in message, message
    assert "trainbook data verify --repair" in message and "register" in message and "again" in message, message
    assert "registered with" not in message and "tamper" not in message, "damage in the store, not the user's bytes"
    assert _cached(tmp_path) == [], "nothing was cached"
    assert _files_in(old["snapshot"]) == before, "a snapshot that cannot be rebuilt is left as it was"


def test_an_old_listing_that_does_not_hash_to_the_registration_is_not_trusted(tmp_path):
    from toolkit import config as config_mod
    from toolkit.data import corpus as data_mod

    old = _old_workspace(tmp_path / "ws", "texts", TEXTS)
    listing = old["listing"][:1]  # a listing naming fewer files: reading by it would train on other bytes
    os.chmod(old["snapshot"] / ".listing.json", 0o644)
    (old["snapshot"] / ".listing.json").write_text(json.dumps(listing, indent=1))
    with pytest.raises(data_assets.DataAssetError, match=r"texts:1 .*no listing .* hashes to .*register its source "
                                                         r"again"):
        data_mod.load_corpus(config_mod.load("tiny", ["data.asset=texts:1", f"data.workspace={tmp_path / 'ws'}"]))
    assert _cached(tmp_path) == []


# Loads the corpus of an asset once told to go (a line on stdin), as each rank of a run does on starting.
RANK = """
import sys
from toolkit import config as config_mod
from toolkit.data import corpus as data_mod
cfg = config_mod.load("tiny", [f"data.asset={sys.argv[1]}", f"data.workspace={sys.argv[2]}", "model.block_size=16"])
print("ready", flush=True)
sys.stdin.readline()
corpus = data_mod.load_corpus(cfg)
print(corpus.asset["sha256"], len(corpus.splits["train"]) + len(corpus.splits["val"]), flush=True)
"""


def test_ranks_starting_together_on_an_old_asset_all_read_it(tmp_path):
    import subprocess
    import sys

    from conftest import PROJECT

    files = {f"part{i:03d}.txt": f"text number {i} ".encode() * 40 for i in range(300)}
    old = _old_workspace(tmp_path / "ws", "texts", files)
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, "texts:1", str(tmp_path / "ws")], cwd=PROJECT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    for rank in ranks:
        assert rank.stdout.readline() == "ready\n", rank.stderr.read()
    for rank in ranks:  # all at once: each finds the old layout and rebuilds or waits for the rebuild
        rank.stdin.write("go\n")
        rank.stdin.flush()
    results = [(rank.wait(timeout=120), rank.stdout.read(), rank.stderr.read()) for rank in ranks]
    assert [code for code, _, _ in results] == [0] * 4, "\n".join(err[-2000:] for _, _, err in results)
    assert {out for _, out, _ in results} == {f"{old['content']} {len(old['tokens'])}\n"}
    assert _files_in(old["snapshot"]) == files
    report = data_verify.verify(Workspace.open(tmp_path / "ws"))
    assert report.ok, report.summary()
