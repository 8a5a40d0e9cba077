"""The package layout's rules, read from the source (no import is run): one package per chapter of the journey,
dependencies that point one way, no import loop between modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
TOOLKIT = PROJECT / "toolkit"

# The layers, lowest first: a module imports only from its own layer and the layers before it. The foundation is
# what every chapter shares (the config, files, names, the run directory and its events); the chapters follow in the
# order their code depends on each other, so the resources chapter (the doctor and the memory estimate run
# training) comes after runs although notebook 01 opens with it.
FOUNDATION = ("toolkit", "toolkit.errors", "toolkit.paths", "toolkit.ports", "toolkit.startup", "toolkit.third_party", "toolkit.extras",
              "toolkit.names", "toolkit.fsio", "toolkit.safe_load", "toolkit.plain_data", "toolkit.key_files",
              "toolkit.machine", "toolkit.deepspeed_config", "toolkit.config", "toolkit.run_lock", "toolkit.status",
              "toolkit.events", "toolkit.trust", "toolkit.rundir", "toolkit.tables", "toolkit.parent_watch")
CHAPTERS = ("catalogue", "data", "checkpoint", "train", "runs", "resources", "deploy", "report", "azure", "cli")
LAYERS = ("foundation", *CHAPTERS)
ENTRY_POINTS = {"toolkit.__main__": "cli"}  # `python -m toolkit` is the command line


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


def layers_of(module: str) -> list[str]:
    """The layers ``module`` is filed in: exactly one when the order is complete."""
    found = ["foundation"] if module in FOUNDATION else []
    found += [c for c in CHAPTERS if module == f"toolkit.{c}" or module.startswith(f"toolkit.{c}.")]
    return found + ([ENTRY_POINTS[module]] if module in ENTRY_POINTS else [])


def backward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module from a later layer than the importer's."""
    rank = {m: LAYERS.index(layers[0]) for m in graph if (layers := layers_of(m))}  # unfiled: the test above's
    return sorted(f"{m} ({LAYERS[rank[m]]}) imports {i} ({LAYERS[rank[i]]})" for m, deps in graph.items()
                  for i in deps if m in rank and i in rank and rank[i] > rank[m])


def test_every_module_is_filed_in_exactly_one_layer():
    misfiled = {m: layers_of(m) for m in MODULES if len(layers_of(m)) != 1}
    assert not misfiled, f"each module needs one layer of {LAYERS}: {misfiled}"
    assert sorted(set(FOUNDATION) - set(MODULES)) == [], "a foundation module listed that does not exist"


def test_no_module_imports_a_later_layer():
    offenders = backward_imports(GRAPH)
    assert not offenders, f"{len(offenders)} imports against the order {' < '.join(LAYERS)}:\n" + "\n".join(offenders)


def test_the_order_check_finds_a_planted_backward_import():
    planted = {**GRAPH, "toolkit.fsio": GRAPH["toolkit.fsio"] | {"toolkit.cli.main"},
               "toolkit.catalogue.workspace": GRAPH["toolkit.catalogue.workspace"] | {"toolkit.train.trainer"}}
    assert backward_imports(planted) == sorted(backward_imports(GRAPH) + [
        "toolkit.catalogue.workspace (catalogue) imports toolkit.train.trainer (train)",
        "toolkit.fsio (foundation) imports toolkit.cli.main (cli)"])


def test_test_files_have_basenames_of_their_own():
    """pytest imports test files by basename (rootdir, no packages): a second tests/*/test_x.py fails collection of
    the whole tier, and only in a run that collects both (make test), not in either folder alone."""
    files = sorted((PROJECT / "tests").rglob("test_*.py"))
    names = [f.name for f in files]
    assert not [f for f in files if names.count(f.name) > 1]


def loop_of(source: str) -> ast.FunctionDef:
    (trainer,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "Trainer"]
    (train,) = [n for n in trainer.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
    return train


def test_the_training_loop_stays_readable_in_one_screen_with_its_step_in_view():
    """Trainer.train() is the spine a reader follows (issue 31): about 60 lines, the step called in it by name."""
    train = loop_of((TOOLKIT / "train" / "trainer.py").read_text())
    length = train.end_lineno - train.lineno + 1
    assert length <= 66, f"Trainer.train() is {length} lines: move what falls due after a step into a component"
    called = {n.func.id for n in ast.walk(train) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "train_step" in called
