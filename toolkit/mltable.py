"""Table assets in Azure ML's MLTable format: delimited files plus an ``MLTable`` YAML with column types.

Only the part of the format Trainbook writes and reads is supported: ``paths`` of ``file`` entries,
``read_delimited`` and ``convert_column_types``. The same folder registers as an Azure ML ``mltable`` asset.
"""

from __future__ import annotations

from pathlib import Path

import yaml

SCHEMA_URL = "https://azuremlschemas.azureedge.net/latest/MLTable.schema.json"
PANDAS_TYPES = {"int": "int64", "float": "float64", "string": "string", "boolean": "bool"}


class MLTableError(ValueError):
    pass


def write_mltable(folder: Path, frame, csv_name: str = "data.csv") -> Path:
    """Write ``frame`` (pandas) as CSV and an MLTable file describing it; returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / csv_name, index=False)
    columns = []
    for name, dtype in frame.dtypes.items():
        kind = "int" if dtype.kind in "iu" else "float" if dtype.kind == "f" else "boolean" if dtype.kind == "b" \
            else "string"
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
    try:
        spec = yaml.safe_load((folder / "MLTable").read_text())
    except FileNotFoundError:
        raise MLTableError(f"path: {str(folder)!r} has no MLTable file; allowed: an MLTable folder") from None
    if not isinstance(spec, dict) or spec.get("type", "mltable") != "mltable" or not spec.get("paths"):
        raise MLTableError(f"{folder / 'MLTable'}: expected 'type: mltable' and a list of 'paths'")
    read = next((t["read_delimited"] for t in spec.get("transformations", []) if "read_delimited" in t), {})
    frames = []
    for entry in spec["paths"]:
        if "file" not in entry:
            raise MLTableError(f"{folder / 'MLTable'}: paths entry {entry!r} is not supported; allowed: 'file'")
        frames.append(pd.read_csv(folder / entry["file"], sep=read.get("delimiter", ",")))
    frame = pd.concat(frames, ignore_index=True)
    for t in spec.get("transformations", []):
        for column in t.get("convert_column_types", []):
            frame[column["columns"]] = frame[column["columns"]].astype(PANDAS_TYPES[column["column_type"]])
    return frame
