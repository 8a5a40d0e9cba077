"""The package layout's rules, read from the source (no import is run): one package per chapter of the journey,
dependencies that point one way, no import loop between modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
TOOLKIT = PROJECT / "toolkit"

FOUNDATION = {"toolkit.fsio", "toolkit.paths", "toolkit.ports", "toolkit.safe_load", "toolkit.names", "toolkit.errors"}
# what a chapter must never import: the steps before deployment know nothing of it, of reports or of the cloud
FORBIDDEN = {
    "train": {"azure", "deploy", "report"},
    "checkpoint": {"azure", "deploy", "report"},
    "data": {"azure", "deploy", "report"},
    "catalogue": {"azure", "report"},
    "resources": {"deploy", "report"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PROJECT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(TOOLKIT.rglob("*.py"))}


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function (a lazy import is still a dependency)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from toolkit.train import trainer` imports a module; `from toolkit.fsio import sha` a name
            found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                         for a in node.names)
    return found


GRAPH = {name: {m for m in imported(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def chapter(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (TOOLKIT / parts[-1]).is_dir() and len(parts) == 2 else None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import loop as a path a -> b -> ... -> a, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (loop := visit(nxt)):
                return loop
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (loop := visit(start)):
            return loop
    return None


def test_every_module_is_found():
    assert {"toolkit.cli", "toolkit.config", "toolkit.train.trainer", "toolkit.runs.launch"} <= set(MODULES)
    assert all(TOOLKIT.joinpath(c, "__init__.py").exists() for c in
               ("resources", "catalogue", "data", "train", "checkpoint", "runs", "deploy", "report", "azure"))


def test_no_import_loop_between_modules():
    assert find_cycle(GRAPH) is None, " -> ".join(find_cycle(GRAPH))


def test_the_cycle_finder_finds_a_planted_loop():
    planted = {**GRAPH, "toolkit.fsio": GRAPH["toolkit.fsio"] | {"toolkit.cli"}}
    assert find_cycle(planted)[0] == find_cycle(planted)[-1]


def test_toolkit_never_imports_widgets():
    offenders = sorted(f"{m} imports {i}" for m, p in MODULES.items() for i in imported(p)
                       if i == "widgets" or i.startswith("widgets."))
    assert not offenders, offenders


@pytest.mark.parametrize("chapter_name", sorted(FORBIDDEN))
def test_chapters_import_only_what_comes_before_them(chapter_name):
    offenders = sorted(f"{m} imports {i}" for m, deps in GRAPH.items() if chapter(m) == chapter_name
                       for i in deps if chapter(i) in FORBIDDEN[chapter_name])
    assert not offenders, offenders


def test_foundation_modules_import_only_each_other():
    offenders = sorted(f"{m} imports {i}" for m in FOUNDATION & set(MODULES) for i in GRAPH[m] if i not in FOUNDATION)
    assert not offenders, offenders


def test_test_files_have_basenames_of_their_own():
    """pytest imports test files by basename (rootdir, no packages): a second tests/*/test_x.py fails collection of
    the whole tier, and only in a run that collects both (make test), not in either folder alone."""
    files = sorted((PROJECT / "tests").rglob("test_*.py"))
    names = [f.name for f in files]
    assert not [f for f in files if names.count(f.name) > 1]
