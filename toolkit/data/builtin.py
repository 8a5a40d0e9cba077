"""Register the data that ships with Python and scikit-learn, so the notebooks have real assets offline."""

from __future__ import annotations

import tempfile
from pathlib import Path

from toolkit.catalogue import data_assets
from toolkit.data.shipped import pydoc_text, stdlib_text
from toolkit.catalogue.mltable import write_mltable


def register_pydoc(ws) -> data_assets.DataAsset:
    """CPython's documentation (pydoc_data.topics) as a text file asset, ``pydoc``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pydoc.txt"
        path.write_bytes(pydoc_text())
        return data_assets.register(
            ws,
            "pydoc",
            path,
            type="uri_file",
            tags={"source": "pydoc_data.topics"},
            description="CPython's own documentation, the byte-level LM corpus",
        )


def register_stdlib(ws) -> data_assets.DataAsset:
    """The standard library's own .py sources (the built-in data.dataset 'stdlib': each file after a '# file: NAME'
    line, joined by blank lines) as a text file asset, ``stdlib``: a code corpus."""
    import sys

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "stdlib.txt"
        path.write_bytes(stdlib_text())
        return data_assets.register(
            ws,
            "stdlib",
            path,
            type="uri_file",
            tags={"source": f"python{sys.version_info.major}.{sys.version_info.minor} stdlib"},
            description="The Python standard library's own source code, a code corpus",
        )


def register_digits(ws) -> data_assets.DataAsset:
    """scikit-learn's 8x8 digits as a table asset, ``digits`` (64 pixel columns and a label)."""
    import pandas as pd
    from sklearn.datasets import load_digits

    digits = load_digits()
    frame = pd.DataFrame(digits.data.astype("int64"), columns=[f"p{i}" for i in range(64)])
    frame["label"] = digits.target.astype("int64")
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_mltable(Path(tmp) / "digits", frame, "digits.csv")
        return data_assets.register(
            ws,
            "digits",
            folder,
            type="mltable",
            tags={"source": "sklearn.load_digits"},
            description="1,797 handwritten digits, 8x8 pixels with values 0-16",
        )


BUILTINS = {"pydoc": register_pydoc, "stdlib": register_stdlib, "digits": register_digits}


def is_builtin(asset: data_assets.DataAsset) -> bool:
    """Registered by one of BUILTINS (which tag their source), not a user's file of the same name."""
    return asset.name in BUILTINS and "source" in asset.tags
