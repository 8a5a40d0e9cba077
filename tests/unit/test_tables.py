"""HTML tables for notebooks (toolkit.report.tables); the writer itself: test_table_writers.py."""

from toolkit.report.tables import top_operators_html


def test_a_run_without_a_profile_has_no_operator_table(tmp_path):
    assert top_operators_html(tmp_path) is None


def test_the_operator_table_reads_where_the_profiler_writes_without_importing_torch(tmp_path, monkeypatch):
    """A report needs the file's name, not the profiler: rendering must work where torch cannot be imported."""
    import json
    import sys

    from toolkit.rundir import OPERATORS_FILE, RunDir

    run = RunDir(tmp_path)
    run.profile_dir.mkdir()
    rows = [{"name": "aten::mm", "self_cpu_ms": 12.5, "self_cpu_pct": 40.0, "cpu_total_ms": 13.0, "calls": 8}]
    (run.profile_dir / OPERATORS_FILE).write_text(json.dumps(rows))
    monkeypatch.setitem(sys.modules, "torch", None)  # any import of torch now fails
    monkeypatch.delitem(sys.modules, "toolkit.train.profiling", raising=False)
    table = top_operators_html(tmp_path)
    assert table is not None and "aten::mm" in table and "top 1 operators" in table
