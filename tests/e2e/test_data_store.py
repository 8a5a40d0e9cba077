"""The datastore behind data assets, checked on real files: blobs are never written through a link, a snapshot
holds exactly the user's files, `data verify` finds every kind of damage, and SIGKILL during `data register`
leaves nothing inconsistent."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit.catalogue import data_assets, data_verify
from toolkit.catalogue.data_assets import DataAssetError
from toolkit.catalogue.mltable import MLTableError, load_mltable, write_mltable
from toolkit.catalogue.workspace import Workspace

from conftest import PROJECT, cli

HEX64 = re.compile(r"[0-9a-f]{64}")


@pytest.fixture
def ws(tmp_path):
    return Workspace.open(tmp_path / "ws")


def _bad_blobs(ws) -> list[str]:
    """Blobs whose bytes do not hash to their name: checked here directly, not through the code under test."""
    blobs = ws.datastore / "blobs"
    return [p.name for p in blobs.iterdir() if HEX64.fullmatch(p.name)
            and hashlib.sha256(p.read_bytes()).hexdigest() != p.name] if blobs.exists() else []


def _files_in(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_source_file_named_like_an_internal_file_is_data(ws, tmp_path):
    shared = b"bytes shared by two assets"
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.txt").write_bytes(shared)
    first = data_assets.register(ws, "other", other)
    folder = tmp_path / "tricky"
    folder.mkdir()
    (folder / ".listing.json").write_bytes(shared)  # the name the old snapshot layout used for itself
    (folder / ".hidden").write_bytes(b"dot-files are data too")
    (folder / "data.txt").write_bytes(b"plain")
    asset = data_assets.register(ws, "tricky", folder)

    assert _bad_blobs(ws) == [], "a blob no longer matches its hash"
    assert (first.path / "x.txt").read_bytes() == shared, "another asset's registered bytes changed"
    assert _files_in(asset.path) == _files_in(folder), "a snapshot holds exactly the user's files"
    assert asset.file_count == 3
    # a job reading the snapshot (or the source) in place sees the registered identity
    assert data_assets.open_path(asset.path).sha256 == asset.sha256
    assert data_assets.open_path(folder).sha256 == asset.sha256


def test_registering_a_snapshot_folder_keeps_every_blob_intact(ws, tmp_path):
    folder = tmp_path / "src"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_bytes(b"alpha")
    (folder / "sub" / "b.txt").write_bytes(b"beta")
    asset = data_assets.register(ws, "src", folder)
    again = data_assets.register(ws, "copy", asset.path)  # a snapshot registered again, under another name
    assert again.sha256 == asset.sha256 and again.path == asset.path
    again = data_assets.register(ws, "copy", asset.path)
    assert again.ref == "copy:1"
    assert _bad_blobs(ws) == []
    assert _files_in(asset.path) == {"a.txt": b"alpha", "sub/b.txt": b"beta"}
    report = data_verify.verify(ws)
    assert report.ok, report.summary()


def test_a_uri_file_named_like_an_internal_file_is_data(ws, tmp_path):
    src = tmp_path / ".listing.json"
    src.write_bytes(b"not a listing")
    asset = data_assets.register(ws, "odd", src, type="uri_file")
    assert asset.path.name == ".listing.json" and asset.path.read_bytes() == b"not a listing"
    assert _bad_blobs(ws) == [] and data_verify.verify(ws).ok


def _damaged_workspace(ws, tmp_path):
    """Four assets, then one kind of damage to each: a tampered blob, a missing file, an extra file, a snapshot
    file replaced by different bytes (no longer a link to its blob)."""
    refs = {}
    for name, files in {"blobby": {"a.txt": b"A" * 10, "b.txt": b"B" * 10},
                        "holes": {"keep.txt": b"keep", "sub/gone.txt": b"gone"},
                        "extra": {"only.txt": b"only"},
                        "swapped": {"s.txt": b"original"}}.items():
        folder = tmp_path / name
        for rel, data in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
        refs[name] = data_assets.register(ws, name, folder)
    blob = ws.datastore / "blobs" / hashlib.sha256(b"A" * 10).hexdigest()
    blob.chmod(0o644)
    with open(blob, "r+b") as f:  # what a write through a hard link did: same inode, other bytes
        f.write(b"Z")
    (refs["holes"].path / "sub" / "gone.txt").unlink()
    (refs["extra"].path / "planted.txt").write_bytes(b"not registered")
    swapped = refs["swapped"].path / "s.txt"
    swapped.unlink()
    swapped.write_bytes(b"tampered")
    return refs, blob.name


def test_verify_names_every_damaged_version_and_file(ws, tmp_path):
    refs, bad_blob = _damaged_workspace(ws, tmp_path)
    report = data_verify.verify(ws)
    assert not report.ok
    found = {(p.asset, p.file) for p in report.problems}
    assert ("blobby:1", "a.txt") in found, report.summary()
    assert ("holes:1", "sub/gone.txt") in found, report.summary()
    assert ("extra:1", "planted.txt") in found, report.summary()
    assert ("swapped:1", "s.txt") in found, report.summary()
    text = report.summary()
    assert bad_blob in text and "missing" in text and "not in its listing" in text, text
    assert not any(p.asset == "blobby:1" and p.file == "b.txt" for p in report.problems), "b.txt is intact"
    assert len(report.problems) == 4, text

    only = data_verify.verify(ws, "extra:1")
    assert [(p.asset, p.file) for p in only.problems] == [("extra:1", "planted.txt")], only.summary()
    with pytest.raises(DataAssetError, match="'nothing' is not registered"):
        data_verify.verify(ws, "nothing")


def test_data_verify_cli_exit_code_and_json(ws, tmp_path):
    folder = tmp_path / "fine"
    folder.mkdir()
    (folder / "f.txt").write_text("fine")
    cli("data", "--workspace", str(ws.root), "register", "fine", str(folder))
    clean = cli("data", "--workspace", str(ws.root), "verify")
    assert clean.returncode == 0 and "no problems" in clean.stdout, clean.stdout + clean.stderr
    _damaged_workspace(ws, tmp_path)
    bad = cli("data", "--workspace", str(ws.root), "verify")
    assert bad.returncode == 1 and "holes:1" in bad.stdout and "sub/gone.txt" in bad.stdout, bad.stdout
    as_json = cli("data", "--workspace", str(ws.root), "verify", "--json")
    assert as_json.returncode == 1
    parsed = json.loads(as_json.stdout)
    assert not parsed["ok"] and {p["asset"] for p in parsed["problems"]} == {"blobby:1", "holes:1", "extra:1",
                                                                              "swapped:1"}
    scoped = cli("data", "--workspace", str(ws.root), "verify", "fine:1", "--json")
    assert scoped.returncode == 0 and json.loads(scoped.stdout)["ok"], scoped.stdout
    unknown = cli("data", "--workspace", str(ws.root), "verify", "nothing")
    assert unknown.returncode == 2 and "'nothing' is not registered" in unknown.stderr


def test_a_tampered_blob_is_replaced_by_the_next_registration_of_its_content(ws, tmp_path):
    refs, _ = _damaged_workspace(ws, tmp_path)
    again = data_assets.register(ws, "blobby", tmp_path / "blobby")  # the source is still intact
    assert again.ref == "blobby:1"
    assert _files_in(again.path) == {"a.txt": b"A" * 10, "b.txt": b"B" * 10}, "serves the registered bytes again"
    assert not any(p.asset == "blobby:1" for p in data_verify.verify(ws).problems)


def _one_file_asset(ws, tmp_path):
    """(source folder, asset, blob) of an asset of one file."""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"A" * 100)
    blob = ws.datastore / "blobs" / hashlib.sha256(b"A" * 100).hexdigest()
    return folder, data_assets.register(ws, "src", folder), blob


def test_a_blob_changed_in_size_behind_its_read_only_mode_is_replaced_by_the_next_registration(ws, tmp_path):
    folder, asset, blob = _one_file_asset(ws, tmp_path)
    blob.chmod(0o644)
    blob.write_bytes(b'[{"name": "what the older Trainbook wrote through a hard link"}]')
    blob.chmod(0o444)  # the mode as it was: only the size tells, and a registration reads no intact-looking blob
    assert data_assets.register(ws, "src", folder).ref == "src:1"
    assert _bad_blobs(ws) == [] and (asset.path / "a.txt").read_bytes() == b"A" * 100
    assert data_verify.verify(ws).ok


def test_a_writable_blob_is_checked_and_made_read_only_again_in_place(ws, tmp_path):
    folder, asset, blob = _one_file_asset(ws, tmp_path)
    blob.chmod(0o644)  # writable: no longer taken as intact without reading it
    inode = blob.stat().st_ino
    data_assets.register(ws, "src", folder)
    assert blob.stat().st_mode & 0o777 == 0o444, "made read-only again"
    assert blob.stat().st_ino == inode == (asset.path / "a.txt").stat().st_ino, "intact: kept, links unchanged"
    assert _bad_blobs(ws) == [] and data_verify.verify(ws).ok


def test_training_reads_only_the_registered_files_and_refuses_one_that_was_replaced(ws, tmp_path, monkeypatch):
    from toolkit.data import corpus as data_mod

    monkeypatch.setenv("TRAINBOOK_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"A" * 400)
    (folder / "b.txt").write_bytes(b"B" * 400)
    asset = data_assets.register(ws, "texts", folder)
    (asset.path / "planted.txt").write_bytes(b"not registered")
    replaced = asset.path / "b.txt"
    replaced.unlink()
    replaced.write_bytes(b"X" * 400)  # a registered file's place taken by other bytes (its blob is intact)
    with pytest.raises(DataAssetError, match=r"b\.txt' of texts:1 is not the file registered as 'b\.txt'.*"
                                             r"data verify texts:1.*--repair"):
        data_mod.token_file(data_assets.open_asset(ws, "texts:1"))
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()], "nothing was cached"
    with pytest.raises(DataAssetError, match="texts:1 was looked up without its listing; .*data_assets.open_asset"):
        data_mod.token_file(data_assets.get(ws, "texts:1"))  # never a walk of the snapshot instead
    replaced.unlink()
    replaced.write_bytes(b"B" * 400)
    # read by its listing: a file that is not in it is never read (data verify still reports it)
    tokens = data_mod.token_file(data_assets.open_asset(ws, "texts:1"))
    assert tokens.read_bytes() == b"A" * 400 + b"\n\n" + b"B" * 400
    assert [p.file for p in data_verify.verify(ws).problems] == ["planted.txt"]


def _as_old_layout(ws, asset) -> None:
    """Turn a snapshot into what the previous Trainbook wrote: the listing inside the snapshot folder, none
    beside it, and a token cache written into the snapshot."""
    listing = json.loads((ws.datastore / "listings" / f"{asset.sha256}.json").read_bytes())[1]
    (ws.datastore / "listings" / f"{asset.sha256}.json").unlink()
    folder = asset.path.parent if asset.type == "uri_file" else asset.path
    (folder / ".listing.json").write_text(json.dumps(listing, indent=1))
    (folder / ".tokens-bytes-v1.u8").write_bytes(b"cached")


def test_an_old_layout_snapshot_is_reported_and_rebuilt(ws, tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"old workspace")
    asset = data_assets.register(ws, "old", folder)
    _as_old_layout(ws, asset)
    assert data_assets.open_path(asset.path).sha256 != asset.sha256, "the old layout changes what a job hashes"
    report = data_verify.verify(ws)
    assert not report.ok and "older Trainbook" in report.summary(), report.summary()
    assert {p.file for p in report.problems} >= {".listing.json", ".tokens-bytes-v1.u8"}, report.summary()

    again = data_assets.register(ws, "old", folder)  # the same content again: a clean snapshot, same version
    assert again.ref == "old:1"
    assert _files_in(again.path) == {"a.txt": b"old workspace"}
    assert data_assets.open_path(again.path).sha256 == asset.sha256
    assert data_verify.verify(ws).ok


def test_repair_rebuilds_old_snapshots_from_intact_blobs_only(ws, tmp_path):
    import shutil

    for name in ("gone", "broken"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / f"{name}.txt").write_bytes(name.encode() * 100)
        _as_old_layout(ws, data_assets.register(ws, name, folder))
        shutil.rmtree(folder)  # the sources are gone: repair has only the datastore to rebuild from
    broken_blob = ws.datastore / "blobs" / hashlib.sha256(b"broken" * 100).hexdigest()
    broken_blob.chmod(0o644)
    broken_blob.write_bytes(b"rot")  # the source is gone too: nothing to rebuild this one from
    report = data_verify.verify(ws, repair=True)
    assert report.repaired == ["gone:1"], report.summary()
    assert _files_in(data_assets.get(ws, "gone:1").path) == {"gone.txt": b"gone" * 100}
    after = data_verify.verify(ws)
    assert {p.asset for p in after.problems} == {"broken:1"}, after.summary()
    assert "register its source again" in after.summary()


def test_a_symlinked_uri_file_is_refused(ws, tmp_path):
    target = tmp_path / "real" / "blob-123.txt"
    target.parent.mkdir()
    target.write_text("the data")
    link = tmp_path / "corpus.txt"
    link.symlink_to(target)
    problems = data_assets.registration_problems("corpus", link, "uri_file")
    assert "path" in problems and str(link) in problems["path"] and str(target) in problems["path"], problems
    with pytest.raises(DataAssetError, match=r"is a symbolic link to .*blob-123.txt.*register .*blob-123.txt"):
        data_assets.register(ws, "corpus", link, type="uri_file")
    assert data_assets.list_assets(ws, include_archived=True) == []
    assert data_assets.register(ws, "corpus", target, type="uri_file").path.read_text() == "the data"


def _table(folder: Path, entry: str) -> Path:
    import pandas as pd

    write_mltable(folder, pd.DataFrame({"a": [1, 2], "label": [0, 1]}))
    spec = (folder / "MLTable").read_text().replace("./data.csv", entry)
    (folder / "MLTable").write_text(spec)
    return folder


@pytest.mark.parametrize("entry", ["OUTSIDE_ABS", "../outside.csv", "sub/../../outside.csv", "link.csv",
                                   "https://example.com/data.csv", "file:///etc/passwd"])
def test_mltable_paths_that_leave_the_folder_are_refused(ws, tmp_path, entry):
    import pandas as pd

    outside = tmp_path / "outside.csv"
    pd.DataFrame({"a": [9], "label": [9]}).to_csv(outside, index=False)
    entry = str(outside) if entry == "OUTSIDE_ABS" else entry
    folder = _table(tmp_path / "table", entry)
    (folder / "sub").mkdir()
    if entry == "link.csv":
        (folder / "link.csv").symlink_to(outside)
    with pytest.raises(MLTableError, match=r"paths entry .* is not allowed; allowed: a file inside the folder"):
        load_mltable(folder)  # a copied folder is untrusted: the reader refuses too
    # registration refuses too, naming the entry (a link leaving the folder already fails the folder rule)
    message = r"is a link to .*outside" if entry == "link.csv" else \
        r"MLTable: paths entry .* is not allowed; allowed: a file inside the folder"
    with pytest.raises(DataAssetError, match=message):
        data_assets.register(ws, "t", folder, type="mltable")
    assert data_assets.list_assets(ws, include_archived=True) == []


def test_mltable_paths_inside_the_folder_still_load(ws, tmp_path):
    folder = _table(tmp_path / "table", "sub/data.csv")
    (folder / "sub").mkdir()
    os.replace(folder / "data.csv", folder / "sub" / "data.csv")
    asset = data_assets.register(ws, "t", folder, type="mltable")
    assert load_mltable(asset.path)["label"].tolist() == [0, 1]


# --- SIGKILL during registration ------------------------------------------------------------------------------


def _sources(root: Path, rng: random.Random) -> dict[str, tuple[Path, str]]:
    """Folders of different shapes: many small files (with dot-files and a user '.listing.json'), a few files
    big enough to be streamed (kills land mid-copy), a mix, and a table."""
    import pandas as pd

    small = root / "small"
    for i in range(120):
        path = small / f"d{i % 4}" / f"f{i:03d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randrange(200, 4000)))
    (small / ".listing.json").write_bytes(b'[{"not": "ours"}]')
    (small / ".hidden").write_bytes(b"dot")
    big = root / "big"
    big.mkdir(parents=True)
    for i in range(3):
        (big / f"part{i}.bin").write_bytes(rng.randbytes(6 << 20))
    mixed = root / "mixed"
    mixed.mkdir(parents=True)
    for i in range(15):
        (mixed / f"m{i}.txt").write_bytes(rng.randbytes(1500))
    (mixed / "large.bin").write_bytes(rng.randbytes(10 << 20))
    table = write_mltable(root / "table", pd.DataFrame({"a": range(500), "label": [i % 3 for i in range(500)]}))
    return {"small": (small, "uri_folder"), "big": (big, "uri_folder"), "mixed": (mixed, "uri_folder"),
            "table": (table, "mltable")}


def _change_one_file(folder: Path, type: str, rng: random.Random) -> None:
    if type == "mltable":  # new rows, still a valid table
        import pandas as pd

        write_mltable(folder, pd.DataFrame({"a": [rng.randrange(10**6) for _ in range(500)],
                                            "label": [i % 3 for i in range(500)]}))
        return
    victim = rng.choice(sorted(p for p in folder.rglob("*") if p.is_file()))
    victim.write_bytes(rng.randbytes(victim.stat().st_size))


# Registers like `trainbook data register`, but says "ready" once its imports are done: the random delay before
# SIGKILL starts there, so kills land in the registration's own work (hashing, copying, linking, committing).
DRIVER = """
import sys
from toolkit.catalogue import data_assets
from toolkit.catalogue.workspace import Workspace
print("ready", flush=True)
print(data_assets.register(Workspace.open(sys.argv[1]), sys.argv[2], sys.argv[3], type=sys.argv[4]).ref)
"""


def _start_register(ws, name: str, path: Path, type: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(ws.root), name, str(path), type], cwd=PROJECT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n", proc.stderr.read()
    return proc


def _unexplained(ws) -> list[str]:
    """Entries of the datastore that are neither a blob, a listing, a snapshot nor a '.tmp' leftover."""
    odd = []
    for path in ws.datastore.rglob("*"):
        parts = path.relative_to(ws.datastore).parts
        if any(part.endswith(".tmp") for part in parts):
            continue
        kind, name = parts[0], parts[1] if len(parts) > 1 else None
        if name is None or (kind == "blobs" and HEX64.fullmatch(name) and len(parts) == 2) or \
                (kind == "listings" and len(parts) == 2 and HEX64.fullmatch(name.removesuffix(".json"))) or \
                (kind == "snapshots" and HEX64.fullmatch(name)):
            continue
        odd.append("/".join(parts))
    return odd


def test_sigkill_during_register_leaves_a_consistent_catalogue(ws, tmp_path, rng):
    sources = _sources(tmp_path / "sources", rng)
    # how long a registration's work takes here: kills are drawn across that span, the median of the registrations
    # that finished so far (the first one writes every blob; later ones, of content already stored, take less)
    proc = _start_register(ws, "big", *sources["big"])
    started = time.monotonic()
    assert proc.wait() == 0, proc.stderr.read()
    finished = [time.monotonic() - started]
    proc.stdout.close(), proc.stderr.close()
    log = [f"one registration took {finished[0]:.2f} s (the seed to replay is in the captured setup output)"]
    kills, complete = 0, set()
    deadline = time.monotonic() + 40
    for i in range(60):
        if time.monotonic() > deadline:  # a very slow machine: fewer iterations, never a test past its bound
            break
        if i >= 30 and kills >= 5:
            break
        key = rng.choice(sorted(sources))
        path, type = sources[key]
        if rng.random() < 0.5:  # new content, so new blobs, listings and snapshots are being written
            _change_one_file(path, type, rng)
        name = rng.choice([key, "shared"])  # one name registered from several folders: versions interleave
        delay = rng.uniform(0.0, 1.3 * statistics.median(finished))
        proc = _start_register(ws, name, path, type)
        started = time.monotonic()
        try:
            proc.wait(timeout=delay)
            finished.append(time.monotonic() - started)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
        err = proc.stderr.read()
        proc.stdout.close(), proc.stderr.close()
        report = data_verify.verify(ws)
        log.append(f"#{i} {name} <- {key}: delay {delay:.3f} s, exit {proc.returncode}, "
                   f"{len(report.leftovers)} leftover(s)")
        context = "\n".join(log)
        assert proc.returncode in (0, -signal.SIGKILL), f"{err}\n{context}"
        assert _bad_blobs(ws) == [], context
        assert report.ok, f"{report.summary()}\n{context}"
        assert _unexplained(ws) == [], context
        for asset in data_assets.list_assets(ws, include_archived=True):  # each new row, read back in place
            if asset.ref not in complete:
                assert data_assets.open_path(asset.path).sha256 == asset.sha256, f"{asset.ref}\n{context}"
                complete.add(asset.ref)
    context = "\n".join(log)
    assert kills >= 5, f"too few registrations were interrupted to mean anything\n{context}"

    # afterwards the catalogue is usable: every folder registers again and reads back with its identity
    for key, (path, type) in sorted(sources.items()):
        done = cli("data", "--workspace", str(ws.root), "register", key, str(path), "--type", type)
        assert done.returncode == 0, f"{done.stderr}\n{context}"
        asset = data_assets.get(ws, done.stdout.strip())
        assert data_assets.open_path(asset.path).sha256 == asset.sha256 == data_assets.open_path(path).sha256
    final = data_verify.verify(ws)
    assert final.ok and _bad_blobs(ws) == [], f"{final.summary()}\n{context}"


# --- a blob rewritten in place through a hard link from outside the store -----------------------------------------

def _register_cli(ws, name: str, path: Path) -> str:
    done = cli("data", "--workspace", str(ws.root), "register", name, str(path))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _tamper_through_a_link(ws, tmp_path, data: bytes) -> tuple[Path, Path]:
    """Rewrite the blob of ``data`` in place through a hard link made outside the store: same inode, same size, the
    read-only mode put back, so nothing its lstat shows tells. Returns (blob, the outside link)."""
    blob = ws.datastore / "blobs" / hashlib.sha256(data).hexdigest()
    outside = tmp_path / f"outside-{blob.name[:8]}"
    os.link(blob, outside)
    outside.chmod(0o644)
    with open(outside, "r+b") as f:
        f.write(bytes(255 - b for b in data))
    outside.chmod(0o444)
    assert blob.stat().st_ino == outside.stat().st_ino and blob.name in _bad_blobs(ws)
    return blob, outside


def _two_assets(tmp_path) -> tuple[Path, Path]:
    """(a folder of two files, a single file) to register as sources."""
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"A" * 100)
    (folder / "b.txt").write_bytes(b"B" * 100)
    single = tmp_path / "single.txt"
    single.write_bytes(b"S" * 100)
    return folder, single


def _unshared(blob: Path, outside: Path) -> None:
    """The store's blob is a fresh file again: a write to the outside link no longer reaches it."""
    assert blob.stat().st_ino != outside.stat().st_ino
    before = blob.read_bytes()
    outside.chmod(0o644)
    outside.write_bytes(b"more tampering")
    assert blob.read_bytes() == before


def test_registering_again_replaces_a_blob_tampered_through_a_hard_link(ws, tmp_path):
    folder, _ = _two_assets(tmp_path)
    assert _register_cli(ws, "src", folder) == "src:1"
    blob, outside = _tamper_through_a_link(ws, tmp_path, b"A" * 100)
    found = cli("data", "--workspace", str(ws.root), "verify")
    assert found.returncode == 1 and "src:1 'a.txt'" in found.stdout and "register its source again" in found.stdout

    assert _register_cli(ws, "src", folder) == "src:1", "the same content: the same version"
    assert _bad_blobs(ws) == [], "the tampered blob was replaced from the source"
    assert _files_in(data_assets.get(ws, "src:1").path) == {"a.txt": b"A" * 100, "b.txt": b"B" * 100}
    clean = cli("data", "--workspace", str(ws.root), "verify")
    assert clean.returncode == 0 and "no problems" in clean.stdout, clean.stdout
    _unshared(blob, outside)


def test_verify_repair_restores_tampered_blobs_from_their_sources(ws, tmp_path):
    folder, single = _two_assets(tmp_path)
    assert _register_cli(ws, "src", folder) == "src:1"
    assert _register_cli(ws, "single", single) == "single:1"
    tampered = [_tamper_through_a_link(ws, tmp_path, data) for data in (b"A" * 100, b"S" * 100)]

    repair = cli("data", "--workspace", str(ws.root), "verify", "--repair")
    assert repair.returncode == 0, repair.stdout + repair.stderr
    for blob, _ in tampered:
        assert blob.name in repair.stdout, f"says which blob it restored:\n{repair.stdout}"
    assert str(folder / "a.txt") in repair.stdout and str(single) in repair.stdout, repair.stdout
    assert _bad_blobs(ws) == []
    assert _files_in(data_assets.get(ws, "src:1").path) == {"a.txt": b"A" * 100, "b.txt": b"B" * 100}
    assert data_assets.get(ws, "single:1").path.read_bytes() == b"S" * 100
    assert cli("data", "--workspace", str(ws.root), "verify").returncode == 0
    for blob, outside in tampered:
        _unshared(blob, outside)


@pytest.mark.parametrize("source_now", ["changed", "missing"])
def test_verify_repair_says_which_blob_it_could_not_restore_and_why(ws, tmp_path, source_now):
    folder, _ = _two_assets(tmp_path)
    assert _register_cli(ws, "src", folder) == "src:1"
    blob, _ = _tamper_through_a_link(ws, tmp_path, b"A" * 100)
    tampered = blob.read_bytes()
    if source_now == "changed":
        (folder / "a.txt").write_bytes(b"a" * 100)
        why = f"its source {str(folder / 'a.txt')!r} no longer holds the registered bytes"
    else:
        (folder / "a.txt").unlink()
        why = f"its source {str(folder / 'a.txt')!r} is missing"

    repair = cli("data", "--workspace", str(ws.root), "verify", "--repair")
    assert repair.returncode == 1, repair.stdout + repair.stderr
    line = next(line for line in repair.stdout.splitlines() if "src:1 'a.txt'" in line)
    assert f"not restored: {why}" in line, line
    assert blob.read_bytes() == tampered, "a blob that cannot be restored is left as found, for the report"
    assert "b.txt" not in repair.stdout, "the intact file is not reported"
