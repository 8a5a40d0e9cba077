"""The benches' figures (bench/figures.py): records written by the real helper, refused when a field is missing or
wrong, rendered into docs/pages/figures.md; and every bench `make bench` runs writes one."""

from __future__ import annotations

import ast
import contextlib
import io
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("bench_figures_under_test", PROJECT / "bench" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


figures = _load()
TRAINING = str(PROJECT / "bench" / "bench_training.py")
SERVING = str(PROJECT / "bench" / "bench_serving.py")
DOCTOR = str(PROJECT / "bench" / "bench_doctor.py")


def _write_three(folder: Path) -> None:
    figures.record(TRAINING, "cli_vs_bare", area="training", figure="training tokens/s through the CLI",
                   compared="CLI / bare loop | own process", values=[0.95, 0.99, 0.98], target=(">=", 0.97),
                   folder=folder)
    figures.record(SERVING, "overhead", area="serving", figure="server overhead at p50",
                   compared="HTTP - in-process <same service>", values=[7.5, 6.1], target=("<", 5.0), unit="ms",
                   folder=folder)
    figures.record(DOCTOR, "whole", area="operations", figure="the whole doctor", compared="wall time",
                   values=[40.0, 61.0, 41.0], target=("<", 60.0), unit="s", judged_on="worst", folder=folder)


def test_the_page_shows_every_record_the_real_helper_wrote(tmp_path):
    _write_three(tmp_path)
    records = figures.read_records(tmp_path)
    assert [r["name"] for r in records] == ["doctor.whole", "serving.overhead", "training.cli_vs_bare"]
    page = figures.render(records, figures.makefile_benches())

    assert "Written by `make bench`" in page and "3 figures" in page
    assert f"{records[0]['machine']['cpus']} CPU cores" in page and f"torch {records[0]['machine']['torch']}" in page
    training = page.index("## Training")
    assert page.index("## Serving") > training and page.index("## Operations") > training
    row = next(line for line in page.splitlines() if "training tokens/s through the CLI" in line)
    assert "CLI / bare loop \\| own process" in row  # a pipe in a text ends no cell
    assert "≥ 0.97" in row and "**0.98x** [0.95 to 0.99]" in row and "| 3 | yes |" in row
    assert records[2]["date"][:10] in row and "M1" in row
    overhead = next(line for line in page.splitlines() if "server overhead" in line)
    assert "&lt;same service&gt;" in overhead and "< 5 ms" in overhead and "**no**" in overhead
    doctor = next(line for line in page.splitlines() if "the whole doctor" in line)
    assert "worst round" in doctor and "**41 s**" in doctor and "**no**" in doctor  # the median passes; 61 s does not
    not_recorded = page[page.index("## Not recorded yet"):]
    assert "`bench/bench_checkpoint.py`" in not_recorded and "bench_training.py" not in not_recorded


def test_a_rerun_replaces_its_own_record_and_keeps_the_others(tmp_path):
    _write_three(tmp_path)
    figures.record(TRAINING, "cli_vs_bare", area="training", figure="training tokens/s through the CLI",
                   compared="CLI / bare loop", values=[1.01], target=(">=", 0.97), folder=tmp_path)
    records = {r["name"]: r for r in figures.read_records(tmp_path)}
    assert len(records) == 3 and records["training.cli_vs_bare"]["n"] == 1


def test_the_record_says_how_the_bench_was_run_and_on_what(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["bench/bench_training.py", "--rounds", "2"])
    rec = figures.record(TRAINING, "cli_vs_bare", area="training", figure="f", compared="c", values=[1.0, 2.0, 4.0],
                         folder=tmp_path)
    assert rec["command"] == "python bench/bench_training.py --rounds 2"
    assert (rec["median"], rec["range"], rec["n"], rec["target"], rec["met"]) == (2.0, [1.0, 4.0], 3, None, None)
    assert json.loads((tmp_path / "training.cli_vs_bare.json").read_text()) == rec
    page = figures.render([rec], ["bench_training.py"])
    assert "`--rounds 2`" in page and "for reference" in page


def test_a_figure_recorded_while_the_machine_was_overloaded_says_so_in_its_row(tmp_path):
    _write_three(tmp_path)
    records = {r["name"]: r for r in figures.read_records(tmp_path)}
    busy, idle = records["training.cli_vs_bare"], records["serving.overhead"]
    cpus = busy["machine"]["cpus"]
    busy["machine"]["load_1min"], idle["machine"]["load_1min"] = cpus + 7.25, cpus - 0.5
    page = figures.render([busy, idle], figures.makefile_benches())
    row = next(line for line in page.splitlines() if "through the CLI" in line)
    assert row.endswith(f", load {cpus + 7.25:.1f} on {cpus} cores |")
    assert " cores |" not in next(line for line in page.splitlines() if "server overhead" in line)
    assert "other work shared the machine" in page


@pytest.mark.parametrize(("field", "value"), [
    ("median", float("nan")), ("median", "0.98"), ("median", 1.5), ("area", "trianing"), ("unit", "tokens"),
    ("n", 0), ("range", [0.99, 0.95]), ("target", {"op": "=>", "value": 0.97}), ("met", False), ("judged_on", "best"),
    ("date", "2026-13-01T00:00:00Z"), ("bench", "../etc/passwd"), ("name", "Training CLI"), ("figure", " "),
])
def test_a_record_with_a_bad_value_is_refused_naming_the_field_and_the_value(tmp_path, field, value):
    _write_three(tmp_path)
    path = tmp_path / "training.cli_vs_bare.json"
    rec = json.loads(path.read_text())
    rec[field] = value
    path.write_text(json.dumps(rec))  # NaN is written as NaN, which Python's json reads back
    with pytest.raises(figures.RecordError) as caught:
        figures.read_records(tmp_path)
    assert str(path) in str(caught.value) and f"field {field!r}: {value!r}" in str(caught.value)


@pytest.mark.parametrize("field", ["median", "target", "met", "date", "machine"])
def test_a_record_with_a_missing_field_is_refused_naming_it(tmp_path, field):
    _write_three(tmp_path)
    path = tmp_path / "serving.overhead.json"
    rec = json.loads(path.read_text())
    del rec[field]
    path.write_text(json.dumps(rec))
    with pytest.raises(figures.RecordError, match=f"field '{field}' is missing"):
        figures.read_records(tmp_path)


def test_a_missing_machine_fact_is_refused_naming_it(tmp_path):
    _write_three(tmp_path)
    path = tmp_path / "doctor.whole.json"
    rec = json.loads(path.read_text())
    del rec["machine"]["torch"]
    path.write_text(json.dumps(rec))
    with pytest.raises(figures.RecordError, match="field 'machine.torch' is missing"):
        figures.read_records(tmp_path)


def test_a_bench_cannot_write_a_record_without_rounds(tmp_path):
    with pytest.raises(figures.RecordError, match="field 'n': 0"):
        figures.record(TRAINING, "empty", area="training", figure="f", compared="c", values=[], folder=tmp_path)
    assert not list(tmp_path.iterdir())


def test_the_writer_refuses_the_whole_page_for_one_bad_record(tmp_path):
    _write_three(tmp_path)
    (tmp_path / "zzz.json").write_text("{not json")
    page = tmp_path / "figures.md"
    done = _write_page(page, tmp_path)
    assert done.returncode == 1 and "zzz.json: not JSON" in done.stderr and not page.exists()


def _records_written(script: Path) -> set[str]:
    """The keys of every figures.record(__file__, KEY, ...) call in ``script``."""
    keys = set()
    for node in ast.walk(ast.parse(script.read_text(), str(script))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "record"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "figures"):
            assert isinstance(node.args[0], ast.Name) and node.args[0].id == "__file__", ast.unparse(node)
            keys.add(ast.unparse(node.args[1]))
    return keys


def test_every_bench_the_makefile_runs_writes_a_record_and_the_page_is_written_last():
    benches = figures.makefile_benches()
    assert len(benches) >= 15 and len(set(benches)) == len(benches)
    silent = [b for b in benches if not _records_written(PROJECT / "bench" / b)]
    assert not silent, f"these benches write no figures.record(__file__, ...): {silent}"
    target = (PROJECT / "Makefile").read_text().split("\nbench:", 1)[1].split("\n\n", 1)[0]
    assert target.rstrip().splitlines()[-1].strip() == "$(PY) bench/figures.py --page docs/pages/figures.md"


def test_the_committed_page_is_in_the_site_nav():
    assert "figures.md" in (PROJECT / "docs" / "mkdocs.yml").read_text()
    assert (PROJECT / "docs" / "pages" / "figures.md").read_text().startswith("<!-- Written by `make bench`")


@dataclass
class Written:
    returncode: int
    stderr: str


def _write_page(page: Path, records: Path, *extra: str) -> Written:
    """``bench/figures.py --page PAGE --records RECORDS EXTRA`` as `make bench` runs it, in this process."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = figures.main(["--page", str(page), "--records", str(records), *extra])
    return Written(code, stderr.getvalue())


def _all_and_one(tmp_path: Path) -> tuple[Path, Path]:
    everything, one = tmp_path / "all", tmp_path / "one"
    _write_three(everything)
    figures.record(TRAINING, "cli_vs_bare", area="training", figure="training tokens/s through the CLI",
                   compared="CLI / bare loop", values=[1.01], target=(">=", 0.97), folder=one)
    return everything, one


def test_a_page_is_not_rewritten_without_figures_it_shows_unless_asked(tmp_path):
    """Records are this checkout's (git ignores them): one bench run in a fresh clone, then the page written again,
    must not take every other bench's figures off the committed page."""
    everything, one = _all_and_one(tmp_path)
    page = tmp_path / "figures.md"
    assert _write_page(page, everything).returncode == 0
    before = page.read_text()
    refused = _write_page(page, one)
    assert refused.returncode == 1 and page.read_text() == before
    assert "would drop 2 figures it shows (doctor.whole, serving.overhead)" in refused.stderr, refused.stderr
    assert "bench/bench_doctor.py, bench/bench_serving.py" in refused.stderr and "--drop-missing" in refused.stderr
    assert _write_page(page, one, "--drop-missing").returncode == 0
    assert "server overhead" not in page.read_text() and "training tokens/s through the CLI" in page.read_text()


def test_a_page_written_before_it_named_its_records_is_guarded_by_its_rows(tmp_path):
    everything, one = _all_and_one(tmp_path)
    page = tmp_path / "figures.md"
    assert _write_page(page, everything).returncode == 0
    page.write_text("".join(line for line in page.read_text().splitlines(keepends=True)
                            if not line.startswith("<!-- records shown:")))
    before = page.read_text()
    refused = _write_page(page, one)
    assert refused.returncode == 1 and page.read_text() == before
    assert "would drop 2 of the 3 figures it shows" in refused.stderr, refused.stderr
