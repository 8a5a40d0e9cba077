"""The guided notebooks import only what stays put when modules move: the public API (``toolkit``'s own names),
the report chapter's drawing modules, and the widgets. Read from the committed cells (no kernel is started)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import toolkit

PROJECT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((PROJECT / "notebooks").glob("*.ipynb"))
# What draws a figure or a table is picture code, not an API: notebooks use it the way the demo report does.
DRAWING_MODULES = {"toolkit.report.plots", "toolkit.report.figures", "toolkit.report.tables"}
ALLOWED = "`from toolkit import NAME` (NAME in toolkit.PUBLIC_API), " + ", ".join(sorted(DRAWING_MODULES)) + \
          " or widgets.*"


def _allowed_module(module: str) -> bool:
    return module in DRAWING_MODULES or module == "widgets" or module.startswith("widgets.") or \
        not (module == "toolkit" or module.startswith("toolkit."))


def python_source(cell_source: str) -> str:
    """A code cell as Python: IPython's line magics and shell escapes (``%time``, ``!ls``) become blank lines,
    keeping the line numbers."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in cell_source.splitlines())


def import_problems(source: str) -> list[str]:
    """Each import of ``source`` that breaks the rule, as 'line N: `statement`: why'."""
    problems = []

    def refuse(node: ast.AST, why: str) -> None:
        problems.append(f"line {node.lineno}: `{ast.get_source_segment(source, node)}`: {why}")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name != "toolkit" and not _allowed_module(alias.name):
                    refuse(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if module == "toolkit":
                unknown = [a.name for a in node.names if a.name not in toolkit.PUBLIC_API]
                if unknown:
                    refuse(node, f"{', '.join(unknown)} not in toolkit.PUBLIC_API")
            elif module == "toolkit.report":
                drawing = [a.name for a in node.names if f"toolkit.report.{a.name}" not in DRAWING_MODULES]
                if drawing:
                    refuse(node, f"imports toolkit.report's {', '.join(drawing)}")
            elif node.level or not _allowed_module(module):
                refuse(node, f"imports from {module}")
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "toolkit" \
                and node.attr not in toolkit.PUBLIC_API and not node.attr.startswith("__"):
            refuse(node, f"toolkit.{node.attr} not in toolkit.PUBLIC_API")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not _allowed_module(node.args[0].value) \
                and ast.unparse(node.func) in ("__import__", "importlib.import_module", "import_module"):
            refuse(node, f"imports {node.args[0].value} by name")
    return problems


def notebook_problems(path: Path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return [f"{path.name} cell {i} (id {cell.get('id', '?')}) {problem}"
            for i, cell in enumerate(cells) if cell["cell_type"] == "code"
            for problem in import_problems(python_source("".join(cell["source"])))]


def test_there_are_notebooks_to_check():
    assert len(NOTEBOOKS) >= 6, NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_imports_only_the_public_api_drawing_modules_and_widgets(path):
    problems = notebook_problems(path)
    assert not problems, f"allowed: {ALLOWED}; found:\n" + "\n".join(problems)


@pytest.mark.parametrize("source", [
    "import toolkit\ncfg = toolkit.load_config('tiny')",
    "from toolkit import load_config, start_run as start",
    "from toolkit.report import plots, figures\nfrom toolkit.report.tables import top_operators_html",
    "import toolkit.report.plots",
    "from widgets.training import TrainingPanel\nimport widgets.resources",
    "import pathlib, pandas as pd\nfrom IPython.display import Image",
    "x = 1\n%time y = 2\n!ls",
])
def test_the_rule_lets_through(source):
    assert import_problems(python_source(source)) == []


@pytest.mark.parametrize("source, problem", [
    ("from toolkit.runs import launch", "line 1: `from toolkit.runs import launch`: imports from toolkit.runs"),
    ("x = 1\nimport toolkit.runs.launch as launch", "line 2: `import toolkit.runs.launch as launch`: imports "
                                                    "toolkit.runs.launch"),
    ("from toolkit import config as config_mod", "config not in toolkit.PUBLIC_API"),
    ("from toolkit import load_config, paths", "`from toolkit import load_config, paths`: paths not in"),
    ("from toolkit.report import demo", "imports toolkit.report's demo"),
    ("from toolkit.report.demo import execute", "imports from toolkit.report.demo"),
    ("import toolkit\ntoolkit.paths.runs_root()", "line 2: `toolkit.paths`: toolkit.paths not in"),
    ("import importlib\nimportlib.import_module('toolkit.events')", "imports toolkit.events by name"),
])
def test_the_rule_refuses_naming_the_line_and_the_import(source, problem):
    (found,) = import_problems(python_source(source))
    assert problem in found, found
