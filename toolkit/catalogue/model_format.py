"""What an exported model folder is, and how one is published.

    read_manifest(folder)          the manifest, checked to be a Trainbook model's (cheap: one small file)
    verify_model_folder(folder)    every byte against the manifest: what a server loads must be what was exported
    check_replaceable(out)         may an export be written at ``out``: missing, empty, or an earlier export
    publish_folder(tmp, out)       swap an export assembled in a toolkit.fsio.staging_folder in at ``out``

Kept apart from :mod:`toolkit.deploy.export` (which imports torch) so that servers, planners and registries can read
and check model folders without paying for torch. Publishing itself (staging, fsync, the one-step swap) is
toolkit.fsio's; this module only says what makes a folder an export (its manifest).
"""

from __future__ import annotations

import os
from pathlib import Path

from toolkit.plain_data import loads_json
from toolkit import fsio
from toolkit.errors import UserError, bounded_repr, not_allowed, refused
from toolkit.fsio import sha256_file

MANIFEST = "trainbook-model.json"
FORMAT = "trainbook-model-v1"
MANIFEST_MAX_BYTES = 1 << 20  # a few files and the run's lineage: kilobytes
WHAT = "a folder written by `trainbook export RUN_DIR`"


class ExportError(UserError, ValueError):
    """A run cannot be exported, or a folder is not an export; the message names what is missing."""


def read_manifest(model_dir: str | Path) -> dict:
    """The manifest of an exported model folder, checked to be one (its files are not read: see
    :func:`verify_model_folder`)."""
    path = Path(model_dir) / MANIFEST
    if not path.is_file() and not path.is_symlink():
        raise ExportError(
            not_allowed("model", model_dir, WHAT, problem=f"is not an exported model folder (no {MANIFEST})")
        )
    try:  # a model folder from elsewhere may make its manifest a link, a FIFO or a huge file: refused, not read
        manifest = loads_json(
            fsio.read_regular_file(path, field="model", error=ExportError, limit=MANIFEST_MAX_BYTES).decode("utf-8")
        )
    except (ValueError, OSError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ExportError(
            not_allowed(
                "model", path, "the manifest the export wrote (export again)", problem=f"cannot be read ({exc})"
            )
        ) from None
    if not isinstance(manifest, dict):
        raise ExportError(
            not_allowed(
                "model",
                path,
                "the manifest the export wrote (export again)",
                problem=f"holds a {type(manifest).__name__}, not an object",
            )
        )
    if manifest.get("format") != FORMAT:
        raise ExportError(
            not_allowed("model", model_dir, FORMAT, problem=f"has format {bounded_repr(manifest.get('format'))}")
        )
    return manifest


# --- verification: what is served is what was exported -----------------------------------------------------------


def _plain_name(name) -> bool:
    """A file directly in the folder (an export is flat) and not hidden: fsio.name_inside, without a '/'."""
    return fsio.name_inside(name) and "/" not in name and not name.startswith(".")


def listed_files(manifest: dict, where: str) -> dict[str, dict]:
    """The manifest's ``files``: plain name -> {"size", "sha256"}; anything else is refused, naming ``where``."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ExportError(
            refused(
                "model",
                f"files {bounded_repr(files)} in {where} is not allowed",
                "an object naming every file of the folder with its size and sha256 (export again)",
            )
        )
    for name, info in files.items():
        if not _plain_name(name):
            raise ExportError(
                refused(
                    "model",
                    f"{where} lists {bounded_repr(name)}",
                    "plain file names inside the folder (no '/', '..' or leading '.')",
                )
            )
        if not fsio.file_entry_ok(info):
            raise ExportError(
                refused(
                    "model",
                    f"{where} lists {bounded_repr(name)} as {bounded_repr(info)}",
                    '{"size": bytes, "sha256": 64 hex digits}',
                )
            )
    return files


def _check_entries(folder: Path, files: dict) -> None:
    """No link, FIFO or device anywhere (fsio.check_plain_folder), every listed name a regular file, nothing
    unlisted a runtime could pick up. Hidden names are otherwise left alone: runtimes load fixed, listed names, and
    a registry may keep its own metadata there."""
    fsio.check_plain_folder(folder, field="model", error=ExportError)
    for entry in os.scandir(folder):
        if entry.name in files and not entry.is_file(follow_symlinks=False):
            raise ExportError(
                not_allowed(
                    "model",
                    folder,
                    "the files as exported (export again)",
                    problem=f"holds {entry.name}, listed in {MANIFEST}, which is not a regular file",
                )
            )
        if entry.name not in files and entry.name != MANIFEST and not entry.name.startswith("."):
            raise ExportError(
                not_allowed(
                    "model",
                    folder,
                    "only the exported files (remove it, or export again)",
                    problem=f"holds {entry.name}, which {MANIFEST} does not list",
                )
            )
    missing = sorted(name for name in files if not (folder / name).is_file())
    if missing:
        raise ExportError(
            not_allowed(
                "model",
                folder,
                "a complete export (export again)",
                problem=f"lacks {', '.join(missing)}, listed in {MANIFEST}",
            )
        )


def verify_model_folder(model_dir: str | Path) -> dict:
    """The manifest of ``model_dir`` once every file it lists has its size and sha256 (sizes first: a torn copy
    fails before any hashing). Refuses links, listed names that leave the folder and unlisted files, naming the
    file. Costs one read of the folder: sha256 runs at ~1.8 GB/s here."""
    folder = Path(model_dir)
    manifest = read_manifest(folder)
    files = listed_files(manifest, repr(str(folder / MANIFEST)))
    _check_entries(folder, files)
    for name, info in files.items():
        size = (folder / name).stat().st_size
        if size != info["size"]:
            raise ExportError(
                not_allowed(
                    "model",
                    folder,
                    "the files as exported (export again)",
                    problem=f"has {name} of {size} bytes, {MANIFEST} lists {info['size']}",
                )
            )
    for name, info in files.items():
        if sha256_file(folder / name) != info["sha256"]:
            raise ExportError(
                not_allowed(
                    "model",
                    folder,
                    "the files as exported (export again)",
                    problem=f"has {name} whose sha256 differs from {MANIFEST}: it was changed after the export",
                )
            )
    return manifest


# --- publishing: the model folder's rule for toolkit.fsio -------------------------------------------------------


def _export_files(folder: Path) -> set[str]:
    """What an earlier export may hold: the files its (readable, well-formed) manifest lists."""
    return set(listed_files(read_manifest(folder), str(folder / MANIFEST)))


# An export says so by its manifest, and holds nothing its manifest does not list.
MODEL_FOLDER = {"marker": MANIFEST, "kind": "model", "error": ExportError, "may_hold": _export_files}


def check_replaceable(out: Path) -> None:
    """``out`` may receive an export: it is missing, empty, or an earlier export (:func:`fsio.check_replaceable`)."""
    fsio.check_replaceable(out, **MODEL_FOLDER)


def publish_folder(tmp: Path, out: Path) -> None:
    """Swap the export assembled in ``tmp`` (an :func:`fsio.staging_folder`) in at ``out`` in one step."""
    fsio.publish_folder(tmp, out, **MODEL_FOLDER)
