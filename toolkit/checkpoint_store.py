"""Checkpoints on disk: atomic publication, manifests, the LATEST pointer, verification, retention.

    checkpoints/
      .tmp-step_00000100/     being written (by every rank); never counts, removed when found stale
      step_00000100/
        manifest.json          step, world size, engine, config, trainer state, sha256 + size of every file
        model.pt ...           the engine's state files, and rank_00000.pt ... (RNG per rank)
      LATEST                   the name of the newest published checkpoint, replaced atomically
      superseded-1700000000-step_00000200/   newer than a checkpoint someone rolled back to: kept, never resumed

A checkpoint counts only if its manifest exists and every file it lists has the recorded size and sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.rundir import atomic_write_text

MANIFEST = "manifest.json"
LATEST = "LATEST"
TMP_PREFIX = ".tmp-"
SUPERSEDED_PREFIX = "superseded-"
HASH_CHUNK = 8 << 20

# Config fields that may change between a checkpoint and the run that resumes from it: they steer the loop
# (how long, how often to log or save), not what a step computes.
RESUMABLE_CHANGES = ("name", "train.max_steps", "train.max_seconds", "train.eval_every", "train.eval_batches",
                     "train.log_every", "profile.", "checkpoint.", "fault.", "data.num_workers",
                     "data.prefetch_factor")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message says which and why."""


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):  # hashlib releases the GIL on large chunks: training keeps going
            digest.update(chunk)
    return digest.hexdigest()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def describe_files(folder: Path, names) -> dict:
    """{relative name: {"size", "sha256"}} for files already written and fsynced."""
    return {name: {"size": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)} for name in names}


@dataclass
class CheckpointInfo:
    name: str
    path: Path
    step: int | None
    valid: bool
    reason: str
    size_bytes: int
    created: float | None
    manifest: dict | None


class CheckpointStore:
    def __init__(self, run_dir: str | Path):
        self.root = Path(run_dir) / "checkpoints"

    # --- writing ----------------------------------------------------------------------------------------

    def tmp_folder(self, step: int) -> Path:
        return self.root / f"{TMP_PREFIX}{step_name(step)}"

    def publish(self, step: int, manifest: dict) -> Path:
        """Write the manifest into the finished temporary folder, rename it into place, then move LATEST."""
        tmp, final = self.tmp_folder(step), self.root / step_name(step)
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1))
        fsync_path(tmp)
        if final.exists():  # a re-run of the same step (after a restart): the new one replaces it
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_path(self.root)
        atomic_write_text(self.root / LATEST, final.name + "\n")
        return final

    def discard_partial(self) -> list[str]:
        """Remove temporary folders of writes that can no longer finish (called before training starts)."""
        removed = []
        if self.root.is_dir():
            for path in self.root.glob(f"{TMP_PREFIX}*"):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
        return removed

    def apply_retention(self, keep_last: int) -> list[str]:
        """Delete the oldest published checkpoints beyond keep_last, never the one LATEST names."""
        latest = self.latest_name()
        published = sorted((p for p in self.root.glob("step_*") if p.is_dir()), key=lambda p: p.name)
        doomed = [p for p in published[:-keep_last] if p.name != latest] if len(published) > keep_last else []
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
        return [p.name for p in doomed]

    def roll_back_to(self, name: str) -> list[str]:
        """Make ``name`` the checkpoint the next resume loads. Newer published checkpoints are renamed
        ``superseded-<time>-step_N`` (kept, never deleted, never resumed from, outside retention); returns their
        new names. Refuses a checkpoint that is not a valid one of this run."""
        published = sorted(p.name for p in self.root.glob("step_*") if p.is_dir()) if self.root.is_dir() else []
        if name not in published:
            raise CheckpointError(f"checkpoint: {name!r} is not a published checkpoint of this run; allowed: "
                                  f"{', '.join(published) or 'none (the run has not checkpointed)'}")
        info = self.inspect(self.root / name)
        if not info.valid:
            raise CheckpointError(f"checkpoint: {name!r} is not valid ({info.reason}); allowed: a valid checkpoint")
        stamp = int(time.time())
        moved = []
        for newer in (n for n in published if n > name):
            target = f"{SUPERSEDED_PREFIX}{stamp}-{newer}"
            os.replace(self.root / newer, self.root / target)
            moved.append(target)
        fsync_path(self.root)
        atomic_write_text(self.root / LATEST, name + "\n")
        return moved

    # --- reading ----------------------------------------------------------------------------------------

    def latest_name(self) -> str | None:
        try:
            return (self.root / LATEST).read_text().strip() or None
        except FileNotFoundError:
            return None

    def inspect(self, path: Path, verify: bool = True) -> CheckpointInfo:
        """Is this folder a usable checkpoint? Checks the manifest and (verify=True) every file's sha256."""
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0
        created = path.stat().st_mtime if path.exists() else None

        def bad(reason, manifest=None, step=None):
            return CheckpointInfo(path.name, path, step, False, reason, size, created, manifest)

        if not path.is_dir():
            return bad("folder does not exist")
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            return bad("no manifest.json (the write never finished)")
        except ValueError as exc:
            return bad(f"manifest.json is not valid JSON ({exc})")
        step = manifest.get("step")
        for name, meta in manifest.get("files", {}).items():
            file = path / name
            if not file.is_file():
                return bad(f"{name} is missing", manifest, step)
            if file.stat().st_size != meta["size"]:
                return bad(f"{name} has {file.stat().st_size} bytes, manifest says {meta['size']} (truncated?)",
                           manifest, step)
            if verify and sha256_file(file) != meta["sha256"]:
                return bad(f"{name} fails its sha256 check (corrupted)", manifest, step)
        return CheckpointInfo(path.name, path, step, True, "ok", size, created, manifest)

    def list(self, verify: bool = True) -> list[CheckpointInfo]:
        """Every checkpoint folder, published or partial, oldest first."""
        if not self.root.is_dir():
            return []
        folders = sorted(p for p in self.root.iterdir() if p.is_dir())
        infos = []
        for path in folders:
            if path.name.startswith(TMP_PREFIX):
                infos.append(CheckpointInfo(path.name, path, None, False, "partial write (never published)",
                                            sum(f.stat().st_size for f in path.rglob("*") if f.is_file()),
                                            path.stat().st_mtime, None))
            elif path.name.startswith(SUPERSEDED_PREFIX):
                info = self.inspect(path, verify)
                info.valid, info.reason = False, "superseded by a roll-back (kept, never resumed from)"
                infos.append(info)
            else:
                infos.append(self.inspect(path, verify))
        return infos

    def find_resume_point(self) -> tuple[CheckpointInfo | None, list[CheckpointInfo]]:
        """The newest valid checkpoint (LATEST first, then older ones), and the invalid ones passed over."""
        skipped = []
        latest = self.latest_name()
        if latest is not None:
            info = self.inspect(self.root / latest)
            if info.valid:
                return info, skipped
            skipped.append(info)
        candidates = sorted((p for p in self.root.glob("step_*") if p.is_dir() and p.name != latest),
                            key=lambda p: p.name, reverse=True) if self.root.is_dir() else []
        for path in candidates:
            info = self.inspect(path)
            if info.valid:
                return info, skipped
            skipped.append(info)
        return None, skipped


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_compatible(manifest: dict, config: dict, world_size: int) -> None:
    """Refuse a checkpoint written by a different model, optimizer, engine or world size, naming the difference."""
    name = step_name(manifest.get("step", 0))
    if manifest.get("world_size") != world_size:
        raise CheckpointError(f"checkpoint {name} was written by {manifest.get('world_size')} processes; this run "
                              f"has {world_size} (engine.nproc). Allowed: the same world size")
    old, new = _flatten(manifest.get("config", {})), _flatten(config)
    differences = [f"{key}: checkpoint {old.get(key)!r}, this run {new.get(key)!r}"
                   for key in sorted(set(old) | set(new))
                   if old.get(key) != new.get(key) and not key.startswith(RESUMABLE_CHANGES)]
    if differences:
        raise CheckpointError(f"checkpoint {name} was written with a different config: " + "; ".join(differences)
                              + ". Allowed to differ: " + ", ".join(RESUMABLE_CHANGES))

