"""The two table writers: ``text_table`` for a terminal or a log, ``html_table`` for a notebook's output area (where
a text table wraps badly). Both take the same rows (dicts or objects) and the same ``Column`` list, so a listing has
one definition of its columns and each verb or panel only picks the writer. ``markdown_cell`` and ``markdown_code``
escape the cells of the docs' Markdown tables (docs/generate.py, bench/figures.py).

Text tables size each column to its widest cell (header included) and never pad the last column, so no line ends in
spaces; numbers align right. HTML cells are escaped unless the value is ``Markup`` (a badge, a ``<code>`` name);
every cell says its alignment (JupyterLab's stylesheet would put text on the right).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


class Markup(str):
    """A cell value that is already HTML, built from escaped parts: ``html_table`` shows it as is."""


@dataclass(frozen=True)
class Column:
    """One column of a table."""

    header: str
    """The column's title."""
    value: str | Callable[[Any], Any]
    """A key of a dict row (or an attribute of an object row), or a function of the row."""
    fmt: str = ""
    """A ``format()`` spec for a present value (``",.0f"``, ``".3f"``); "" is ``str()``."""
    right: bool = False
    """Align right (numbers); text aligns left."""
    missing: str = "-"
    """What a cell shows when the value is None."""

    def cell(self, row) -> str:
        if callable(self.value):
            value = self.value(row)
        else:
            value = row.get(self.value) if isinstance(row, Mapping) else getattr(row, self.value)
        if value is None:
            return self.missing
        return value if isinstance(value, Markup) else format(value, self.fmt)


def text_table(rows: Iterable, columns: list[Column], indent: str = "", gap: int = 2) -> str:
    """``rows`` as fixed-width text: a header line, then a line per row, each prefixed by ``indent``."""
    cells = [[column.cell(row) for column in columns] for row in rows]
    widths = [max([len(column.header)] + [len(line[i]) for line in cells]) for i, column in enumerate(columns)]

    def line(texts: list[str]) -> str:
        parts = []
        for i, (text, column) in enumerate(zip(texts, columns, strict=True)):
            if column.right:
                parts.append(text.rjust(widths[i]))
            else:
                parts.append(text if i == len(columns) - 1 else text.ljust(widths[i]))
        return indent + (" " * gap).join(parts).rstrip()

    return "\n".join([line([c.header for c in columns]), *(line(texts) for texts in cells)])


def html_table(
    rows: Sequence,
    columns: list[Column] | None = None,
    caption: str = "",
    empty: str | None = "nothing yet",
    highlight: Callable[[Any], str] | None = None,
    attrs: str = "style='border-collapse:collapse'",
) -> str:
    """``rows`` as an HTML table with a header row. Text cells are escaped, ``Markup`` cells are not; numbers
    (``right`` columns) align right.

    ``columns`` None: a column per key of the first (dict) row, the key as its header. ``empty``: the italic note
    shown instead of a table without rows; None shows the header alone. ``highlight(row)``: a CSS background for the
    row, or "". ``attrs``: the ``<table>`` tag's attributes."""
    if not rows and empty is not None:
        return f"<i style='color:#888'>{html.escape(empty)}</i>"
    if columns is None:
        columns = [Column(str(key), key, missing="") for key in (rows[0] if rows else ())]
    head = "".join(f"<th{_align(c)}>{html.escape(c.header)}</th>" for c in columns)
    body = []
    for row in rows:
        background = highlight(row) if highlight else ""
        cells = "".join(f"<td{_align(c)}>{_html(c.cell(row))}</td>" for c in columns)
        body.append(f"<tr style='background:{background}'>{cells}</tr>" if background else f"<tr>{cells}</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return (
        f"<table{' ' + attrs if attrs else ''}>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
        "</table>"
    )


def _align(column: Column) -> str:
    # JupyterLab's stylesheet aligns every table cell right: text says left itself
    return f" style='text-align:{'right' if column.right else 'left'}'"


def _html(text: str) -> str:
    return text if isinstance(text, Markup) else html.escape(text)


def markdown_cell(text: str) -> str:
    """Text for a Markdown table cell: pipes escaped everywhere; outside `code spans`, angle brackets and
    asterisks escaped so that runs/<name> and 6 x N read as written."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("*", r"\*")
        out.append(part.replace("|", r"\|"))
    return "".join(out)


def markdown_code(value: str) -> str:
    """A code span that survives a Markdown table cell (pipes escaped, backticks fenced by longer runs)."""
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}".replace("|", r"\|")
