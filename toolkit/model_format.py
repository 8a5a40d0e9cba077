"""What an exported model folder is: its manifest's name and format, and the check that a folder is one.

Kept apart from :mod:`toolkit.export` (which imports torch) so that planners and registries can read model
folders without paying for torch.
"""

from __future__ import annotations

import json
from pathlib import Path

MANIFEST = "trainbook-model.json"
FORMAT = "trainbook-model-v1"


class ExportError(ValueError):
    """A run cannot be exported, or a folder is not an export; the message names what is missing."""


def read_manifest(model_dir: str | Path) -> dict:
    """The manifest of an exported model folder, checked to be one."""
    path = Path(model_dir) / MANIFEST
    if not path.is_file():
        raise ExportError(f"model: {str(model_dir)!r} is not an exported model folder (no {MANIFEST}); allowed: "
                          "a folder written by `trainbook export RUN_DIR`")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ExportError(f"model: {str(model_dir)!r} has format {manifest.get('format')!r}; allowed: {FORMAT}")
    return manifest
