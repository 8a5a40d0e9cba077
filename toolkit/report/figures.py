"""Key figures a notebook reports for the demo's summary table: ``record(endpoint_p50_ms=18.2)``.

They go to the JSON file named by $TRAINBOOK_FIGURES (the demo sets it); without it, ``record`` does nothing,
so a notebook run by hand writes nothing anywhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from toolkit.fsio import atomic_write_text

ENV = "TRAINBOOK_FIGURES"


def record(**figures) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    merged = {**read(path), **{k: (v.item() if hasattr(v, "item") else v) for k, v in figures.items()}}
    atomic_write_text(Path(path), json.dumps(merged, indent=1, sort_keys=True))


def read(path: str | Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
