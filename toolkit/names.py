"""The one rule for names a user gives (data assets, models, endpoints) and for references to a registered
version, with the message that refuses a bad one. A name becomes a folder in the workspace, so the rule keeps
out '/', '..' and anything a filesystem or Azure ML would reject."""

from __future__ import annotations

import re

from toolkit.errors import RefusedValue, not_allowed

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
NAME_ALLOWED = "letters, digits, '_', '-', '.', starting with a letter or digit, at most 255 characters"
REF_ALLOWED = "'name' (latest) or 'name:version' with a version of 1 or more"


def is_name(value) -> bool:
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None


def name_problem(field: str, value) -> str | None:
    """The message that refuses ``value`` as the name in ``field``; None when it is a name."""
    return None if is_name(value) else not_allowed(field, value, NAME_ALLOWED)


def check_name(value, field: str = "name", error: type[Exception] = RefusedValue) -> str:
    if problem := name_problem(field, value):
        raise error(problem)
    return value


def split_ref(ref) -> tuple[str, int | None] | None:
    """(name, version) of ``name`` or ``name:version`` (version None: the latest); None when ``ref`` is neither."""
    name, sep, version = str(ref).partition(":")
    # isascii: str.isdigit also takes '²' and Arabic-Indic digits, which int() reads or refuses
    if not is_name(name) or (sep and not (version.isascii() and version.isdigit() and int(version) >= 1)):
        return None
    return name, int(version) if sep else None


def parse_ref(ref, field: str, error: type[Exception] = RefusedValue) -> tuple[str, int | None]:
    if (parsed := split_ref(ref)) is None:
        raise error(not_allowed(field, ref, REF_ALLOWED, problem="is not a reference"))
    return parsed
