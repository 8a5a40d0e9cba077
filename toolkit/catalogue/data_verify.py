"""Verifying and repairing a workspace's data: every blob re-hashed, every version's snapshot checked against its
listing, damage reported as a Problem naming the version and file, and (on request) damaged blobs restored from
their versions' sources where those still hold the registered bytes, then snapshots rebuilt from intact blobs. It
owns no part of the layout: it reads ``datastore/`` as :mod:`toolkit.catalogue.data_store` defines it and the
catalogue's rows through :mod:`toolkit.catalogue.data_assets`.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field

from toolkit.catalogue.data_assets import get, parse_ref, repair_version, source_file
from toolkit.catalogue.data_store import (
    BLOBS,
    LISTINGS,
    OLD_LISTING,
    SHA256_RE,
    SNAPSHOTS,
    TMP_SUFFIX,
    blob_states,
    restore_blob,
    snapshot_folder,
    snapshot_problems,
    version_listing,
)
from toolkit.catalogue.workspace import Workspace


@dataclass
class Problem:
    asset: str | None  # name:version, or None for the store itself
    file: str | None  # the file inside the asset, or the entry of the store
    message: str

    def __str__(self) -> str:
        where = " ".join(x for x in (self.asset, self.file and repr(self.file)) if x)
        return f"{where}: {self.message}" if where else self.message


@dataclass
class VerifyReport:
    assets: list[str]  # the versions checked
    blobs: int  # blobs re-hashed
    bytes: int
    problems: list[Problem] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)  # '.tmp' entries of interrupted registrations
    repaired: list[str] = field(default_factory=list)  # versions whose snapshot was rebuilt from their blobs
    restored: list[str] = field(default_factory=list)  # damaged blobs stored again from a version's source

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        head = f"checked {len(self.assets)} asset version(s) and {self.blobs} blob(s) ({self.bytes:,} bytes): " + (
            f"{len(self.problems)} problem(s)" if self.problems else "no problems"
        )
        lines = [head, *(f"  {p}" for p in self.problems)]
        lines += [f"restored {line}" for line in self.restored]
        if self.repaired:
            lines.append(f"repaired (snapshot rebuilt from intact blobs): {', '.join(self.repaired)}")
        if self.leftovers:
            lines.append(
                f"{len(self.leftovers)} '.tmp' leftover(s) of interrupted registrations: harmless, safe to delete"
            )
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {"ok": self.ok, **asdict(self)}


def _rows_to_verify(ws: Workspace, ref: str | None) -> list:
    """Every version (archived too), every version of NAME, or NAME:VERSION."""
    query, args = "SELECT * FROM data_assets", ()
    if ref is not None:
        name, version = parse_ref(ref)
        query, args = (
            (query + " WHERE name = ?", (name,))
            if version is None
            else (query + " WHERE name = ? AND version = ?", (name, version))
        )
    conn = ws.connect()
    try:
        rows = conn.execute(query + " ORDER BY name, version", args).fetchall()
    finally:
        conn.close()
    if ref is not None and not rows:
        get(ws, ref)  # refuses the reference, naming the versions that exist
    return rows


def _store_entries(ws: Workspace) -> tuple[set[str], list[Problem], list[str]]:
    """(blob names, unexpected entries, '.tmp' leftovers) of the whole datastore."""
    patterns = {BLOBS: SHA256_RE, LISTINGS: re.compile(r"[0-9a-f]{64}\.json"), SNAPSHOTS: SHA256_RE}
    blobs, odd, leftovers = set(), [], []
    for kind, pattern in patterns.items():
        folder = ws.datastore / kind
        for name in sorted(os.listdir(folder)) if folder.is_dir() else []:
            if name.endswith(TMP_SUFFIX):
                leftovers.append(f"{kind}/{name}")
            elif not pattern.fullmatch(name):
                odd.append(Problem(None, f"{kind}/{name}", "unexpected entry in the datastore"))
            elif kind == BLOBS:
                blobs.add(name)
    return blobs, odd, leftovers


def verify(ws: Workspace, ref: str | None = None, repair: bool = False, progress: bool = False) -> VerifyReport:
    """Re-hash every blob (its bytes must hash to its name) and check each asset version's snapshot against its
    listing: files missing, extra, changed, or not linked to the right blob. ``ref``: NAME (every version) or
    NAME:VERSION; default the whole datastore. ``repair`` first restores each damaged blob from the source of a
    version that uses it, if that file still hashes to the blob's name, then rebuilds the snapshots of versions
    whose listing and blobs are intact (those of older Trainbooks, or damaged); a blob whose sources all changed
    is reported with why, and stays as found."""
    if repair:
        ws.require_writable()  # refused before minutes of hashing, not at the first repair
    rows = _rows_to_verify(ws, ref)
    listings = {(row["name"], row["version"]): version_listing(ws, row) for row in rows}
    used = {entry["sha256"] for listing, _, _ in listings.values() for entry in listing or []}
    stored, problems, leftovers = _store_entries(ws) if ref is None else (set(), [], [])
    states, hashed = blob_states(ws, stored | used, progress)
    problems += [
        Problem(None, f"{BLOBS}/{name}", state) for name, state in sorted(states.items()) if state and name not in used
    ]  # a damaged blob no version uses (a model's, or an orphan)
    report = VerifyReport([f"{row['name']}:{row['version']}" for row in rows], len(states), hashed, leftovers=leftovers)
    not_restored = _restore_blobs(ws, rows, listings, states, report) if repair else {}
    for row in rows:
        listing, found, old_layout = listings[(row["name"], row["version"])]
        asset_problems = _version_problems(ws, row, listing, found, old_layout, states, not_restored)
        repaired = repair_version(ws, row, listing, states) if asset_problems and repair else None
        if repaired is not None:
            asset_problems = _version_problems(ws, repaired, listing, [], False, states, not_restored)
            if not asset_problems:
                report.repaired.append(f"{row['name']}:{row['version']}")
        problems += asset_problems
    report.problems = problems
    return report


def _restore_blobs(
    ws: Workspace, rows: list, listings: dict, states: dict[str, str | None], report: VerifyReport
) -> dict[tuple[str, str], str]:
    """Store each damaged blob that a version uses again from that version's source, if the source still holds
    the registered bytes (hash-checked; another version's source may, where one's does not). Restored blobs are
    marked intact in ``states`` and named in ``report.restored``; returns {(version, file): why its source could
    not restore its blob}."""
    not_restored = {}
    for row in rows:
        ref = f"{row['name']}:{row['version']}"
        for entry in listings[(row["name"], row["version"])][0] or []:
            if not states.get(entry["sha256"]):
                continue  # intact, or restored from another version's source
            source = source_file(row, entry)
            why = restore_blob(ws, entry["sha256"], source)
            if why is None:
                states[entry["sha256"]] = None
                report.restored.append(
                    f"blob {entry['sha256']} from its source {str(source)!r} ({ref} {entry['name']!r})"
                )
            else:
                not_restored[(ref, entry["name"])] = f"its source {str(source)!r} {why}"
    return not_restored


def _blob_advice(ref: str, name: str, not_restored: dict[tuple[str, str], str]) -> str:
    """What to do about a damaged blob: why --repair did not restore it, if it tried."""
    why = not_restored.get((ref, name))
    if why is None:
        return "register its source again, or run `trainbook data verify --repair` (either restores it from there)"
    return f"not restored: {why}; registering any file with the registered bytes restores it"


def _version_problems(
    ws: Workspace,
    row,
    listing: list[dict] | None,
    found: list[str],
    old_layout: bool,
    states: dict[str, str | None],
    not_restored: dict[tuple[str, str], str],
) -> list[Problem]:
    ref = f"{row['name']}:{row['version']}"
    problems = [Problem(ref, None, message) for message in found]
    if listing is None:
        return problems
    if (row["file_count"], row["size_bytes"]) != (len(listing), sum(e["size"] for e in listing)):
        problems.append(
            Problem(
                ref,
                None,
                f"the catalogue says {row['file_count']} file(s), {row['size_bytes']:,} bytes; its listing disagrees",
            )
        )
    folder = snapshot_folder(ws, row)
    if folder.resolve() != (ws.datastore / SNAPSHOTS / row["sha256"]).resolve():
        problems.append(Problem(ref, None, f"its snapshot {row['snapshot']!r} is not {SNAPSHOTS}/{row['sha256']}"))
    for entry in listing:
        state = states.get(entry["sha256"])
        if state:
            problems.append(
                Problem(
                    ref,
                    entry["name"],
                    f"its blob {entry['sha256']} {state}; " + _blob_advice(ref, entry["name"], not_restored),
                )
            )
    for name, message in snapshot_problems(folder, listing, ws.datastore / BLOBS):
        if old_layout and name == OLD_LISTING and not any(e["name"] == OLD_LISTING for e in listing):
            message += " (the older Trainbook's own listing)"
        problems.append(Problem(ref, name or None, message))
    return problems
