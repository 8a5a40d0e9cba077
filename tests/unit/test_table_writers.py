"""The two table writers: widths from the cells, numbers right, no trailing spaces; HTML escaped but for Markup."""

from __future__ import annotations

from dataclasses import dataclass

from toolkit.tables import Column, Markup, html_table, text_table

COLUMNS = [Column("name", "name"), Column("tokens/s", "tps", ",.0f", right=True), Column("note", "note")]
ROWS = [{"name": "a-long-run-name", "tps": 12345.6, "note": "ok"}, {"name": "b", "tps": None, "note": "<b>x</b>"}]


def test_text_columns_are_as_wide_as_their_widest_cell_and_numbers_align_right():
    lines = text_table(ROWS, COLUMNS).splitlines()
    assert lines == ["name             tokens/s  note",
                     "a-long-run-name    12,346  ok",
                     "b                       -  <b>x</b>"]


def test_no_line_ends_in_spaces_even_when_the_last_column_is_empty():
    text = text_table([{"name": "a", "tps": 1, "note": ""}], COLUMNS, indent="  ")
    assert all(line == line.rstrip() and line.startswith("  ") for line in text.splitlines())


def test_rows_may_be_objects_and_values_functions_of_the_row():
    @dataclass
    class Row:
        size_bytes: int

    table = text_table([Row(3 * 2**20)], [Column("size MB", lambda r: r.size_bytes / 2**20, ".1f", right=True)])
    assert table.splitlines()[1].strip() == "3.0"


def test_html_escapes_text_cells_and_keeps_markup_cells():
    page = html_table([{**ROWS[1], "name": Markup("<code>b</code>")}], COLUMNS, caption="a & b")
    assert "<td style='text-align:left'><code>b</code></td>" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<caption>a &amp; b</caption>" in page
    assert page.count("<tr>") == 2  # the header row and one row


def test_html_cells_are_escaped_and_columns_kept_in_order():
    table = html_table([{"b": 1.5, "a": "<script>"}, {"a": "x"}],
                       [Column("name", "a"), Column("ms", "b", ".1f", right=True, missing="")], caption="t & u")
    assert "<script>" not in table and "&lt;script&gt;" in table and "t &amp; u" in table
    assert table.index(">name</th>") < table.index(">ms</th>")
    assert ">x</td><td style='text-align:right'></td>" in table, "a missing value is an empty cell"


def test_html_columns_default_to_the_first_rows_keys_and_an_empty_listing_may_say_so():
    assert html_table([{"step": 1, "loss": 2.5}]).count("</th>") == 2
    assert html_table([], empty="no checkpoints yet") == "<i style='color:#888'>no checkpoints yet</i>"
    assert "background:#fdd" in html_table([{"status": 500}], highlight=lambda r: "#fdd" if r["status"] != 200 else "")


def test_an_empty_listing_is_its_header():
    assert text_table([], COLUMNS) == "name  tokens/s  note"
