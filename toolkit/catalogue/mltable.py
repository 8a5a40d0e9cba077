"""Table assets in Azure ML's MLTable format: delimited files plus an ``MLTable`` YAML with column types.

Only the part of the format Trainbook writes and reads is supported: ``paths`` of ``file`` entries,
``read_delimited`` (or ``read_parquet``, with pyarrow installed) and ``convert_column_types``. The same folder
registers as an Azure ML ``mltable`` asset.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path, PurePosixPath

import yaml

from toolkit.errors import UserError, bounded_repr, not_allowed, refused

SCHEMA_URL = "https://azuremlschemas.azureedge.net/latest/MLTable.schema.json"
PANDAS_TYPES = {"int": "int64", "float": "float64", "string": "string", "boolean": "bool"}
SCHEME_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")  # https:, azureml:, file:, and a Windows drive (C:)
ALLOWED_PATHS = (
    "a file inside the folder, relative to it (no absolute path, no '..', no URL, no link leaving the folder)"
)


class MLTableError(UserError, ValueError):
    pass


class MLTablePathError(MLTableError):
    """A ``paths`` entry that leaves the MLTable's folder: the table could change without its folder changing."""


def path_problem(entry) -> str | None:
    """Why a ``paths`` entry's file may not be read, judged on its text alone (links are checked on disk)."""
    file = entry.get("file") if isinstance(entry, dict) else None
    if (
        not isinstance(file, str)
        or not file.strip()
        or SCHEME_RE.match(file)
        or "\\" in file
        or file.startswith("~")
        or PurePosixPath(file).is_absolute()
        or ".." in PurePosixPath(file).parts
    ):
        return refused(None, f"paths entry {bounded_repr(entry)} is not allowed", ALLOWED_PATHS)
    return None


def _file_inside(folder: Path, entry) -> Path:
    """The file a ``paths`` entry names, refused unless it lies inside ``folder`` (a copied folder is untrusted:
    an absolute path, '..', a URL or a link out of it would read other data than the folder's)."""
    problem = path_problem(entry)
    target = (folder / entry["file"]).resolve() if problem is None else None
    if target is not None and not target.is_relative_to(folder.resolve()):
        problem = refused(
            None, f"paths entry {bounded_repr(entry)} is not allowed", f"{ALLOWED_PATHS}; it leads to {str(target)!r}"
        )
    if problem is not None:
        raise MLTablePathError(f"{folder / 'MLTable'}: {problem}")
    return target


def write_mltable(folder: Path, frame, csv_name: str = "data.csv") -> Path:
    """Write ``frame`` (pandas) as CSV and an MLTable file describing it; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / csv_name, index=False)
    columns = []
    for name, dtype in frame.dtypes.items():
        kind = (
            "int"
            if dtype.kind in "iu"
            else "float"
            if dtype.kind == "f"
            else "boolean"
            if dtype.kind == "b"
            else "string"
        )
        columns.append({"columns": str(name), "column_type": kind})
    spec = {
        "$schema": SCHEMA_URL,
        "type": "mltable",
        "paths": [{"file": f"./{csv_name}"}],
        "transformations": [
            {"read_delimited": {"delimiter": ",", "header": "all_files_same_headers", "encoding": "utf8"}},
            {"convert_column_types": columns},
        ],
    }
    (folder / "MLTable").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder


def load_mltable(folder: str | Path):
    """Read an MLTable folder into one pandas DataFrame, with the declared column types."""
    import pandas as pd

    folder = Path(folder)
    if (folder / "MLTable").resolve().parent != folder.resolve():
        raise MLTablePathError(
            refused(
                f"{folder / 'MLTable'}", "is a link out of its folder", "an MLTable file inside the folder it describes"
            )
        )
    try:
        spec = yaml.safe_load((folder / "MLTable").read_text())
    except FileNotFoundError:
        raise MLTableError(not_allowed("path", folder, "an MLTable folder", problem="has no MLTable file")) from None
    if not isinstance(spec, dict) or spec.get("type", "mltable") != "mltable" or not spec.get("paths"):
        raise MLTableError(f"{folder / 'MLTable'}: expected 'type: mltable' and a list of 'paths'")
    transformations = spec.get("transformations", [])
    read = next((t["read_delimited"] for t in transformations if "read_delimited" in t), {})
    parquet = any(isinstance(t, dict) and "read_parquet" in t for t in transformations)
    if parquet and importlib.util.find_spec("pyarrow") is None:
        raise MLTableError(
            refused(
                f"{folder / 'MLTable'}",
                "reads Parquet files (read_parquet), which needs pyarrow, and pyarrow is not installed",
                "CSV tables (read_delimited), or `pip install pyarrow` for Parquet",
            )
        )
    for entry in spec["paths"]:
        if not isinstance(entry, dict) or "file" not in entry:
            raise MLTableError(
                refused(f"{folder / 'MLTable'}", f"paths entry {bounded_repr(entry)} is not supported", "'file'")
            )
    files = [_file_inside(folder, entry) for entry in spec["paths"]]  # every path checked before any is read
    frames = [pd.read_parquet(file) if parquet else pd.read_csv(file, sep=read.get("delimiter", ",")) for file in files]
    frame = pd.concat(frames, ignore_index=True)
    for t in spec.get("transformations", []):
        for column in t.get("convert_column_types", []):
            frame[column["columns"]] = frame[column["columns"]].astype(PANDAS_TYPES[column["column_type"]])
    return frame
