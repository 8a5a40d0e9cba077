"""HTML tables for notebooks (toolkit.report.tables)."""

from toolkit.report.tables import html_table, top_operators_html


def test_cells_are_escaped_and_columns_kept_in_order():
    table = html_table([{"b": 1.5, "a": "<script>"}, {"a": "x"}], {"a": "name", "b": "ms"}, caption="t & u")
    assert "<script>" not in table and "&lt;script&gt;" in table and "t &amp; u" in table
    assert table.index("<th>name</th>") < table.index("<th>ms</th>")
    assert "<td>x</td><td></td>" in table, "a missing value is an empty cell"


def test_a_run_without_a_profile_has_no_operator_table(tmp_path):
    assert top_operators_html(tmp_path) is None
