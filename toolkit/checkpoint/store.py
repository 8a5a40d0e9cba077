"""Checkpoints on disk: atomic publication, manifests, the LATEST pointer, verification, retention.

    checkpoints/
      .tmp-step_00000100/     being written (by every rank); never counts, removed when found stale
      step_00000100/
        manifest.json          step, world size, engine, config, trainer state, checksum + size of every file
        model.pt ...           the engine's state files, and rank_00000.pt ... (RNG per rank)
      LATEST                   the name of the newest published checkpoint, replaced atomically
      superseded-1700000000-step_00000200/   newer than a checkpoint someone rolled back to: kept, never resumed

A checkpoint counts only if its manifest exists and is well-formed, the folder holds exactly the files it lists
(no links, no extra files), every file has the recorded size and checksum (toolkit.checkpoint.checksum), and no ``.pt``
file would import anything but tensors and plain data when loaded (toolkit.safe_load). A run directory may be a
copy from elsewhere: LATEST and manifests are read as untrusted text, so no name in them leads outside the run's
checkpoints folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.config import EngineConfig, field_choices
from toolkit.checkpoint.checksum import ALGORITHMS, CHECKPOINT_CHECKSUM, entry_checksum, file_checksum
from toolkit.errors import UserError, bounded_repr, not_allowed, refused
from toolkit.plain_data import loads_json
from toolkit.fsio import (
    PLAIN_FOLDER,
    NotPlainEntry,
    atomic_write_text,
    fsync_path,
    name_inside,
    plain_files,
    read_regular_file,
    swap_in,
)

MANIFEST = "manifest.json"
LATEST = "LATEST"
TMP_PREFIX = ".tmp-"
SUPERSEDED_PREFIX = "superseded-"
LATEST_MAX_BYTES = 256  # a checkpoint name and a newline
MANIFEST_MAX_BYTES = 16 << 20  # the config and a few files per rank: kilobytes; far beyond any real manifest
STEP_RE = re.compile(r"step_\d{8,}")  # what step_name() writes; the only names LATEST may hold
ENGINES = tuple(field_choices(EngineConfig, "name"))

# Config fields that may change between a checkpoint and the run that resumes from it: they steer the loop
# (how long, how often to log or save), not what a step computes.
RESUMABLE_CHANGES = (
    "name",
    "train.max_steps",
    "train.max_seconds",
    "train.min_steps",
    "train.eval_every",
    "train.eval_batches",
    "train.eval_at_start",
    "train.log_every",
    "profile.",
    "checkpoint.",
    "fault.",
    "data.num_workers",
    "data.prefetch_factor",
    "data.record_samples",
    "debug.",
    "tracking.",
    "watchdog.",
    "engine.nproc",  # with engine.tensor_parallel, as long as the data-parallel replicas stay (check_compatible)
    "engine.tensor_parallel",
    "engine.pipeline_parallel",
    "engine.name",  # between the layouts of one computation only (torch and fsdp: check_compatible)
    "engine.fsdp_",
)
# Engines that compute the same steps from the same state, and so may take each other's checkpoints: DDP's whole
# tensors resharded by FSDP, FSDP's shards assembled by DDP (DeepSpeed's files are its own)
INTERCHANGEABLE_ENGINES = ("torch", "fsdp")


# Where a run's inputs are, not what they are: an Azure ML job mounts its inputs under a folder named after the job, so
# a resubmitted job (toolkit.runs.job) finds its data, model code and weights at new paths. What the data is, the
# lineage records by content; a resumed run takes its weights from the checkpoint, not init_from.
LOCATION_FIELDS = ("data.path", "model.code_path", "model.hf.source", "model.init_from")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used; the message says which and why."""


SHARDS = "shards"
"""A sharded checkpoint's subfolder: one folder of each rank's shards (toolkit.checkpoint.sharded)."""


def shard_folder(rank: int) -> str:
    """The relative name of ``rank``'s shard folder in a checkpoint (an engine's checkpoint_state key)."""
    return f"{SHARDS}/rank_{rank:05d}"


def is_shard_folder(name: str) -> bool:
    """Is a checkpoint_state entry a rank's shard folder rather than one .pt file?"""
    return name.startswith(f"{SHARDS}/")


def step_name(step: int) -> str:
    return f"step_{step:08d}"


def describe_files(folder: Path, names) -> dict:
    """{relative name: {"size", checksum}} for files already written and fsynced (by someone other than the
    checkpointer's own writer, which checksums as it writes)."""
    return {
        name: {"size": (folder / name).stat().st_size, CHECKPOINT_CHECKSUM: file_checksum(folder / name)}
        for name in names
    }


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

    def check_own_folder(self) -> None:
        """Refuse to write or delete through a checkpoints/ that is a link (a copied run directory could point it
        at any folder, whose step_* entries retention would then delete)."""
        if self.root.is_symlink():
            raise CheckpointError(
                refused(
                    "checkpoint",
                    f"{self.root} is a link to {bounded_repr(os.readlink(self.root))}",
                    "a real folder inside the run directory (nothing was written or deleted)",
                )
            )

    def publish(self, step: int, manifest: dict) -> Path:
        """Write the manifest into the finished temporary folder, rename it into place, then move LATEST."""
        self.check_own_folder()
        tmp, final = self.tmp_folder(step), self.root / step_name(step)
        atomic_write_text(tmp / MANIFEST, json.dumps(manifest, indent=1))
        fsync_path(tmp)
        # A re-run of the same step (after a restart) replaces the earlier folder in one step: at no moment is
        # there no step_N (the earlier one, now at the temporary name, is removed after; or at the next start).
        previous = swap_in(tmp, final)
        fsync_path(self.root)
        if previous is not None:
            shutil.rmtree(previous, ignore_errors=True)
        atomic_write_text(self.root / LATEST, final.name + "\n")
        return final

    def discard_partial(self) -> list[str]:
        """Remove temporary folders of writes that can no longer finish (called before training starts)."""
        self.check_own_folder()
        removed = []
        if self.root.is_dir():
            for path in self.root.glob(f"{TMP_PREFIX}*"):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
        return removed

    def published(self) -> list[Path]:
        """Published checkpoint folders, oldest first: real folders (not links) named step_NNNNNNNN."""
        if not self.root.is_dir():
            return []
        return sorted(
            (p for p in self.root.iterdir() if STEP_RE.fullmatch(p.name) and p.is_dir() and not p.is_symlink()),
            key=lambda p: p.name,
        )

    def apply_retention(self, keep_last: int) -> list[str]:
        """Delete the oldest published checkpoints beyond keep_last, never the one LATEST names."""
        self.check_own_folder()
        latest = self.latest_name()
        published = self.published()
        doomed = [p for p in published[:-keep_last] if p.name != latest] if len(published) > keep_last else []
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
        return [p.name for p in doomed]

    def roll_back_to(self, name: str) -> list[str]:
        """Make ``name`` the checkpoint the next resume loads. Newer published checkpoints are renamed
        ``superseded-<time>-step_N`` (kept, never deleted, never resumed from, outside retention); returns their
        new names. Refuses a checkpoint that is not a valid one of this run."""
        self.check_own_folder()
        published = [p.name for p in self.published()]
        if name not in published:
            raise CheckpointError(
                not_allowed(
                    "checkpoint",
                    name,
                    ", ".join(published) or "none (the run has not checkpointed)",
                    problem="is not a published checkpoint of this run",
                )
            )
        info = self.inspect(self.root / name)
        if not info.valid:
            raise CheckpointError(
                not_allowed("checkpoint", name, "a valid checkpoint", problem=f"is not valid ({info.reason})")
            )
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
        """The checkpoint LATEST names, if it names one the way step_name() writes it (never a path)."""
        text = self.latest_text()
        return text if text is not None and STEP_RE.fullmatch(text) else None

    def latest_text(self) -> str | None:
        """What LATEST holds (a copied run may make it a link, a FIFO or a huge file: described, never followed)."""
        try:
            data = read_regular_file(self.root / LATEST, field=LATEST, error=CheckpointError, limit=LATEST_MAX_BYTES)
        except FileNotFoundError:
            return None
        except (CheckpointError, OSError) as exc:
            return f"<unreadable: {exc}>"
        return data.decode(errors="replace").strip() or None

    def inspect(self, path: Path, verify: bool = True) -> CheckpointInfo:
        """Is this folder a usable checkpoint? Checks the manifest, the folder's files against it and
        (verify=True) every file's checksum and what each .pt file would import."""
        size = (
            sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
            if path.is_dir() and not path.is_symlink()
            else 0
        )
        created = path.lstat().st_mtime if path.exists() or path.is_symlink() else None

        def bad(reason, manifest=None, step=None):
            return CheckpointInfo(path.name, path, step, False, reason, size, created, manifest)

        if path.is_symlink():
            return bad(
                refused(
                    None, f"is a link to {bounded_repr(os.readlink(path))}", "a folder inside the run's checkpoints/"
                )
            )
        if not path.is_dir():
            return bad("folder does not exist")
        try:
            manifest = loads_json(
                read_regular_file(path / MANIFEST, field=MANIFEST, error=CheckpointError, limit=MANIFEST_MAX_BYTES)
            )
        except FileNotFoundError:
            return bad("no manifest.json (the write never finished)")
        except CheckpointError as exc:
            return bad(str(exc))
        except (ValueError, OSError) as exc:
            return bad(f"manifest.json is not valid JSON ({exc})")
        problem = manifest_problem(manifest, path.name)
        if problem:
            return bad(f"manifest.json: {problem}")
        step = manifest["step"]
        problem = _folder_problem(path, manifest["files"])
        if problem:
            return bad(problem, manifest, step)
        for name, meta in manifest["files"].items():
            file = path / name
            if file.stat().st_size != meta["size"]:
                return bad(
                    f"{name} has {file.stat().st_size} bytes, manifest says {meta['size']} (truncated?)", manifest, step
                )
            algorithm, expected = entry_checksum(meta)
            if verify and file_checksum(file, algorithm) != expected:
                return bad(f"{name} fails its {algorithm} check (corrupted)", manifest, step)
        if verify:
            from toolkit import safe_load

            for name in sorted(n for n in manifest["files"] if n.endswith(".pt")):
                problem = safe_load.file_problem(path / name)
                if problem:
                    return bad(problem, manifest, step)
            for name in sorted(n for n in manifest["files"] if is_shard_folder(n) and n.endswith("/.metadata")):
                problem = safe_load.dcp_metadata_problem(path / name, shown=name)
                if problem:
                    return bad(problem, manifest, step)
        return CheckpointInfo(path.name, path, step, True, "ok", size, created, manifest)

    def list(self, verify: bool = True) -> list[CheckpointInfo]:
        """Every checkpoint folder, published or partial, oldest first."""
        if not self.root.is_dir():
            return []
        folders = sorted(p for p in self.root.iterdir() if p.is_dir())
        infos = []
        for path in folders:
            if path.name.startswith(TMP_PREFIX):
                infos.append(
                    CheckpointInfo(
                        path.name,
                        path,
                        None,
                        False,
                        "partial write (never published)",
                        sum(f.stat().st_size for f in path.rglob("*") if f.is_file()),
                        path.stat().st_mtime,
                        None,
                    )
                )
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
        latest, text = self.latest_name(), self.latest_text()
        if latest is not None:
            info = self.inspect(self.root / latest)
            if info.valid:
                return info, skipped
            skipped.append(info)
        elif text is not None:  # LATEST names something that is not a checkpoint name: never followed
            skipped.append(
                CheckpointInfo(
                    LATEST,
                    self.root / LATEST,
                    None,
                    False,
                    refused(None, f"LATEST holds {bounded_repr(text)}", f"a checkpoint name such as {step_name(100)}"),
                    0,
                    None,
                    None,
                )
            )
        for path in reversed([p for p in self.published() if p.name != latest]):
            info = self.inspect(path)
            if info.valid:
                return info, skipped
            skipped.append(info)
        return None, skipped


def manifest_problem(manifest, folder_name: str) -> str | None:
    """What is wrong with a checkpoint manifest read from disk (None if nothing): every field the loaders use,
    with the right type, and file names that stay inside the checkpoint folder."""
    if not isinstance(manifest, dict):
        return refused(None, f"a JSON {type(manifest).__name__}", "a JSON object")
    step, trainer, files = manifest.get("step"), manifest.get("trainer"), manifest.get("files")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return not_allowed("step", step, "an integer of 0 or more")
    if STEP_RE.fullmatch(folder_name) and folder_name != step_name(step):
        return f"step: {step} does not match the folder name {folder_name!r}"
    world = manifest.get("world_size")
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        return not_allowed("world_size", world, "an integer of 1 or more")
    for field in ("tensor_parallel", "pipeline_parallel"):
        split = manifest.get(field, 1)
        if isinstance(split, bool) or not isinstance(split, int) or split < 1 or world % split:
            return not_allowed(field, split, f"an integer of 1 or more that divides world_size ({world})")
    if manifest.get("engine", "torch") not in ENGINES:
        return not_allowed("engine", manifest.get("engine"), ", ".join(ENGINES))
    if not isinstance(manifest.get("config", {}), dict):
        return refused("config", f"a JSON {type(manifest['config']).__name__}", "a JSON object")
    if (
        not isinstance(trainer, dict)
        or trainer.get("step") != step
        or not isinstance(trainer.get("train_seconds"), (int, float))
        or not isinstance(trainer.get("horizon"), int)
    ):
        return not_allowed("trainer", trainer, f"an object with step (= {step}), horizon and train_seconds")
    if not isinstance(files, dict) or not files:
        return not_allowed("files", files, "an object of file name -> size and checksum")
    for name, meta in files.items():
        if not name_inside(name) or name == MANIFEST:
            return not_allowed("files", name, "a relative path inside the checkpoint folder")
        if entry_checksum(meta) is None:
            return not_allowed(
                f"files.{name}",
                meta,
                f"an object with size (integer) and one checksum ({' or '.join(ALGORITHMS)}, hex string)",
            )
    return None


def _folder_problem(path: Path, files: dict) -> str | None:
    """The folder must hold exactly the listed files and the manifest: no link (it could lead anywhere), and no
    unlisted file (it would be loaded without having been verified)."""
    try:
        found = set(plain_files(path))
    except NotPlainEntry as exc:
        return refused(None, str(exc), PLAIN_FOLDER)
    except OSError as exc:  # removed or made unreadable while it was listed
        return f"the folder cannot be read ({exc.strerror or exc})"
    missing = sorted(set(files) - found)
    if missing:
        return f"{missing[0]} is missing"
    extra = sorted(found - set(files) - {MANIFEST})
    if extra:
        return refused(None, f"{extra[0]} is not listed in manifest.json", "only the files the manifest lists")
    return None


def flatten_config(d: dict, prefix: str = "") -> dict:
    """A nested config dict as dotted field names: {'train': {'seed': 1}} -> {'train.seed': 1}."""
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out.update(flatten_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(old: dict, new: dict, allowed: tuple[str, ...] = ()) -> list[tuple[str, object, object]]:
    """(field, old value, new value) for every field of two config dicts that differs, in field-name order; fields
    starting with one of ``allowed`` may differ."""
    old, new = flatten_config(old), flatten_config(new)
    return [
        (key, old.get(key), new.get(key))
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key) and not key.startswith(allowed)
    ]


def _sampling(config: dict):
    data = config.get("data") if isinstance(config, dict) else None
    return data.get("sampling") if isinstance(data, dict) else None


def check_compatible(manifest: dict, config: dict, world_size: int, ranks_per_replica: int = 1) -> None:
    """Refuse a checkpoint written by a different model, optimizer, engine or number of data-parallel replicas,
    naming the difference. The processes may change where the replicas do not (engine.tensor_parallel and
    engine.pipeline_parallel: the files hold whole tensors), so that a run saved at tensor_parallel 2 resumes at 1.
    ``ranks_per_replica``: the ranks that share one copy of the model (tensor_parallel x pipeline_parallel)."""
    name = step_name(manifest.get("step", 0))
    written_world = manifest.get("world_size")
    written_split = manifest.get("tensor_parallel", 1) * manifest.get("pipeline_parallel", 1)
    replicas = world_size // ranks_per_replica
    written_replicas = written_world // written_split if isinstance(written_world, int) else None
    # data.sampling=epochs keeps a position in samples, not steps: the replicas may change (elastic training)
    elastic = _sampling(config) == _sampling(manifest.get("config", {})) == "epochs"
    if replicas != written_replicas and not elastic:
        raise CheckpointError(
            f"checkpoint {name} was written by {written_world} processes; this run has {world_size} "
            f"(engine.nproc): {replicas} data-parallel replicas where it had {written_replicas} (processes / "
            "engine.tensor_parallel / engine.pipeline_parallel). Allowed: the same number of replicas, each drawing "
            "the batches it drew before (or data.sampling=epochs, whose position survives a change of replicas)"
        )
    engines = (manifest.get("engine", "torch"), (config.get("engine") or {}).get("name", "torch"))
    if engines[0] != engines[1] and not set(engines) <= set(INTERCHANGEABLE_ENGINES):
        raise CheckpointError(
            f"checkpoint {name} was written by engine.name={engines[0]!r}; this run has {engines[1]!r}. Allowed: the "
            f"same engine, or any of {', '.join(INTERCHANGEABLE_ENGINES)} for a checkpoint of one of them"
        )
    differences = [
        f"{key}: checkpoint {old!r}, this run {new!r}"
        for key, old, new in config_differences(manifest.get("config", {}), config, RESUMABLE_CHANGES + LOCATION_FIELDS)
    ]
    if differences:
        raise CheckpointError(
            f"checkpoint {name} was written with a different config: "
            + "; ".join(differences)
            + ". Allowed to differ: "
            + ", ".join(RESUMABLE_CHANGES)
        )
