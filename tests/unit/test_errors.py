"""The one wording of a refused value (toolkit.errors), and that no other module writes it by hand."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from toolkit.errors import SHOWN_CHARS, UserError, bounded_repr, not_allowed, refused

PROJECT = Path(__file__).resolve().parents[2]
HAND_WRITTEN = re.compile(r"allowed(?: [^;:]*)?:")  # "allowed:", "allowed for type X:", "allowed from:" ...


def test_a_bad_value_names_field_value_and_what_is_allowed():
    assert not_allowed("train.lr", -1.0, "> 0") == "train.lr: -1.0 is not allowed; allowed: > 0"
    assert not_allowed("--sku", "X", "A, B", problem="is not a known VM size") == \
        "--sku: 'X' is not a known VM size; allowed: A, B"


def test_a_path_is_shown_as_its_string():
    assert not_allowed("run_dir", Path("/tmp/r"), "a run directory", problem="is not a folder") == \
        "run_dir: '/tmp/r' is not a folder; allowed: a run directory"


def test_a_refusal_without_a_shown_value_and_a_bare_reason():
    assert refused("params", "missing", "a count") == "params: missing; allowed: a count"
    assert refused(None, "a JSON list", "a JSON object") == "a JSON list; allowed: a JSON object"


def test_a_huge_value_is_cut_and_its_length_given():
    message = not_allowed("text", "x" * 1_000_000, "short text")
    assert len(message) < SHOWN_CHARS + 100
    assert message == f"text: {repr('x' * 1_000_000)[:SHOWN_CHARS]}... (1,000,002 characters) is not allowed; " \
                      "allowed: short text"
    assert bounded_repr("x" * (SHOWN_CHARS - 2)) == repr("x" * (SHOWN_CHARS - 2))  # exactly the limit: whole


def test_a_value_nested_too_deeply_for_repr_is_shown_by_its_type():
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert bounded_repr(deep) == "a list nested too deeply to show"


def test_an_integer_too_long_to_print_is_shown_by_its_size():
    assert bounded_repr(10 ** 10_000) == f"an integer of {(10 ** 10_000).bit_length():,} bits"


def string_constants(tree: ast.AST):
    """Every string constant of a module except docstrings (a docstring may quote the format)."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def hand_written_refusals(source: str, path: str) -> list[str]:
    return [f"{path}:{line}: {text!r}" for line, text in string_constants(ast.parse(source, path))
            if HAND_WRITTEN.search(text)]


def test_the_scan_finds_a_hand_written_refusal_but_not_a_docstring():
    planted = ('def f(x):\n    """x: bad; allowed: good"""\n    raise ValueError(f"x: {x!r} is bad; allowed: good")\n'
               '    raise ValueError(f"x: {x!r} is bad; allowed for y: good")\n'
               '    raise ValueError(f"x: {x!r} is not allowed for y")\n')
    assert [hit.split(": ", 1)[0] for hit in hand_written_refusals(planted, "m.py")] == ["m.py:3", "m.py:4"]


def test_only_toolkit_errors_writes_the_refusal_wording():
    offenders = [hit for folder in ("toolkit", "widgets") for path in sorted((PROJECT / folder).rglob("*.py"))
                 if path != PROJECT / "toolkit" / "errors.py"
                 for hit in hand_written_refusals(path.read_text(), str(path.relative_to(PROJECT)))]
    assert not offenders, f"{len(offenders)} hand-written refusals; use toolkit.errors:\n" + "\n".join(offenders)


# Raised and handled inside a run, a worker or the verb that raises them: one that reaches the CLI is a bug, and its
# traceback is what a report needs.
INTERNAL_ERRORS = {"NonFiniteLossError", "CollectiveError", "ServiceError", "ScalingError", "PreflightError",
                   "DebuggerError", "TemplateRenderError"}  # the last: a renderer process's answer, never printed
# The RuntimeErrors the CLI named as user errors before UserError (it printed every ValueError as one too).
PRINTED_RUNTIME_ERRORS = {"CheckpointError", "RunBusyError", "NotThisRunError", "TensorBoardError", "WorkspaceError",
                          "EndpointError"}


def error_classes() -> dict[str, type]:
    """Every module-level class named ``...Error`` in toolkit and widgets, imported: name -> class."""
    found = {}
    for folder in ("toolkit", "widgets"):
        for path in sorted((PROJECT / folder).rglob("*.py")):
            names = [node.name for node in ast.parse(path.read_text()).body
                     if isinstance(node, ast.ClassDef) and node.name.endswith("Error")]
            if names:
                module = importlib.import_module(".".join(path.relative_to(PROJECT).with_suffix("").parts))
                found.update((name, getattr(module, name)) for name in names)
    return found


def test_every_error_the_cli_printed_is_a_user_error_and_every_other_one_is_named_internal():
    classes = error_classes()
    assert INTERNAL_ERRORS | PRINTED_RUNTIME_ERRORS <= classes.keys(), "a class named here no longer exists"
    printed = sorted(name for name, cls in classes.items()
                     if issubclass(cls, ValueError) or name in PRINTED_RUNTIME_ERRORS)
    assert len(printed) > 20 and not [name for name in printed if not issubclass(classes[name], UserError)]
    undecided = sorted(name for name, cls in classes.items()
                       if not issubclass(cls, UserError) and name not in INTERNAL_ERRORS)
    assert not undecided, f"decide: UserError (the user can fix it) or INTERNAL_ERRORS (a bug at the CLI): {undecided}"
