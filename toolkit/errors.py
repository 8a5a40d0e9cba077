"""The one wording of a refused value: ``FIELD: VALUE PROBLEM; allowed: WHAT``.

Every layer builds its messages here (this module imports nothing from toolkit, so any module may use it) and
raises its own exception class with the text; a shown value is bounded so a huge bad input never makes a huge
message. Every exception class a person can act on derives from :class:`UserError`.
"""

from __future__ import annotations

import os

SHOWN_CHARS = 200  # how much of a value's repr a message repeats


class UserError(Exception):
    """Bad input, or a refused state, that the user can fix: the CLI prints its message as one line and exits 2.

    A class derives from it and from the builtin it always was (``class ConfigError(UserError, ValueError)``), so
    ``except ValueError`` keeps working. Any other exception that reaches the CLI is a bug: it keeps its traceback.
    """


class RefusedValue(UserError, ValueError):
    """A refused value (a flag, a config field, a name) where the module has no error class of its own."""


class MissingPath(UserError, FileNotFoundError):
    """A path the user named that is missing or is not what the verb needs (a run directory that holds no run)."""


class PathTaken(UserError, FileExistsError):
    """A path the user named that already holds something the verb will not overwrite."""


def bounded_repr(value) -> str:
    """``repr(value)`` (a path as its string's repr), cut to SHOWN_CHARS with "..." and the full length."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    try:
        text = repr(value)
    except ValueError:  # an int over sys.get_int_max_str_digits() has no repr; its size is what matters
        return f"an integer of {value.bit_length():,} bits" if isinstance(value, int) else type(value).__name__
    except RecursionError:  # a list or mapping nested about as deep as Python's recursion limit (parsed JSON)
        return f"a {type(value).__name__} nested too deeply to show"
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}... ({len(text):,} characters)"


def not_allowed(field: str, value, allowed: str, problem: str = "is not allowed") -> str:
    """The message for a bad value: ``f"{field}: {bounded_repr(value)} {problem}; allowed: {allowed}"``."""
    return f"{field}: {bounded_repr(value)} {problem}; allowed: {allowed}"


def refused(field: str | None, problem: str, allowed: str) -> str:
    """``"{field}: {problem}; allowed: {allowed}"`` when no value is shown as such; field None: a bare reason."""
    return f"{problem}; allowed: {allowed}" if field is None else f"{field}: {problem}; allowed: {allowed}"
