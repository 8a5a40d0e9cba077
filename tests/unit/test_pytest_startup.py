"""The suite's own start-up. pytest loads every plugin installed with an entry point; nbval's imports nbformat, then
jsonschema, then rfc3987-syntax, which compiles its grammars at import: a second of CPU in every pytest process and
more in per-item hooks, about a tenth of the unit tier. pyproject.toml's addopts leave it out (``-p no:nbval``);
test_notebook.py's nbval runs clear addopts and get it back."""

from __future__ import annotations

import sys


def test_the_suite_runs_without_loading_nbval():
    assert not [m for m in sys.modules if m == "nbval" or m.startswith("nbval.")], "nbval was loaded"
