"""The benchmarks' measured figures: one JSON record per figure, and the page that shows them all.

    python bench/figures.py --page docs/pages/figures.md [--records DIR]

Every bench script in the Makefile's bench target calls ``record`` where it prints a summary (a ratio against a
baseline measured in the same run, median and range over interleaved rounds, against its target): the record holds
what was compared, the median, range and n, the target and whether it was met, how the bench was run and the machine
it ran on. Records go to bench/records/ (ignored by git: they are this checkout's runs), or $TRAINBOOK_BENCH_RECORDS,
one file per figure, so a bench run again replaces its own figures and leaves the others.

`make bench` ends with the page: a table per area, the benches with no record yet, and the GPU check reports in
bench/results/. A record with a missing field or a bad value is refused, naming the file, the field and the value.
The page names the records it shows; writing it again from records that lack some of them (one bench run in a fresh
clone) is refused, naming what it would drop, unless --drop-missing says so.
Standard library only at import (torch is asked for its GPU only when a record is written).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import math
import os
import re
import shlex
import statistics
import sys
from pathlib import Path
from typing import Any

from toolkit.tables import markdown_cell, markdown_code

BENCH = Path(__file__).resolve().parent
PROJECT = BENCH.parent
RECORDS = BENCH / "records"
RESULTS = BENCH / "results"
PAGE = PROJECT / "docs" / "pages" / "figures.md"

AREAS = {"training": "Training", "checkpoints": "Checkpoints", "data": "Data", "serving": "Serving",
         "memory": "Memory", "scaling": "Scaling", "fine-tuning": "Fine-tuning",
         "operations": "Operations: the doctor, tracking, the watchdog"}
UNITS = {"x": "x", "s": " s", "ms": " ms", "%": "%"}
OPS = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b, "<": lambda a, b: a < b}
OP_TEXT = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}
# "worst": the bench judges its worst round (e.g. the doctor: every run under 60 s), not the median
JUDGED_ON = ("median", "worst")
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
SHOWN = re.compile(r"^<!-- records shown: (.*) -->$", re.M)  # the page's own list of the records it shows


class RecordError(ValueError):
    """A record the page will not show: a field missing, or a value that is not allowed."""


# ---------------------------------------------------------------------------------------------------- writing

def machine() -> dict[str, Any]:
    """What the figures depend on: cores, CPU, GPU, torch, Python, and how loaded the machine was when it recorded."""
    cpu_model = None
    try:
        found = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu_model = found.group(1).strip() if found else None
    except OSError:
        pass
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "not installed"
    gpu = None
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return {"cpus": os.cpu_count() or 1, "usable_cpus": len(os.sched_getaffinity(0)), "cpu_model": cpu_model,
            "gpu": gpu, "torch": torch_version, "python": sys.version.split()[0],
            "load_1min": round(os.getloadavg()[0], 2)}


def record(bench_file: str, key: str, *, area: str, figure: str, compared: str, values: list[float],
           target: tuple[str, float] | None = None, unit: str = "x", judged_on: str = "median",
           note: str | None = None, folder: Path | None = None) -> dict[str, Any]:
    """Write one figure of the bench ``bench_file`` (its ``__file__``) as a record; return the record.

    ``values``: one per round (a per-round ratio, or whatever the figure is); ``target``: (operator, value), e.g.
    (">=", 0.97), or None for a figure quoted for reference."""
    bench = Path(bench_file).name
    values = [float(v) for v in values]  # numpy or torch scalars too
    median = statistics.median(values) if values else math.nan  # no values: refused below (n is 0)
    judged = median if judged_on == "median" else _worst(values, target)
    rec = {"name": f"{Path(bench).stem.removeprefix('bench_')}.{key}", "bench": bench, "area": area,
           "figure": figure, "compared": compared, "unit": unit, "median": median,
           "range": [min(values), max(values)] if values else None, "n": len(values),
           "target": {"op": target[0], "value": target[1]} if target else None, "judged_on": judged_on,
           "met": OPS[target[0]](judged, target[1]) if target and target[0] in OPS else None, "note": note,
           "command": shlex.join(["python", f"bench/{bench}", *sys.argv[1:]]),
           "machine": machine(), "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    validate(rec, f"{bench} {key}")  # a bench that records nonsense fails here, in its own run, not at the page
    out = Path(folder or os.environ.get("TRAINBOOK_BENCH_RECORDS") or RECORDS)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{rec['name']}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(rec, indent=1) + "\n")
    partial.replace(path)
    return rec


def _worst(values: list[float], target: tuple[str, float] | None) -> float:
    if not values or not target:
        return math.nan
    return min(values) if target[0] in (">=", ">") else max(values)


# ---------------------------------------------------------------------------------------------------- checking

def _refuse(source: str, field: str, value: Any, allowed: str) -> RecordError:
    return RecordError(f"{source}: field {field!r}: {value!r} is not allowed; allowed: {allowed}")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: Any) -> bool:
    return isinstance(value, str) and value.strip() != ""


def validate(rec: Any, source: str) -> None:
    """Raise RecordError naming the first field that is missing or holds a value the page cannot show honestly."""
    if not isinstance(rec, dict):
        raise _refuse(source, "(record)", rec, "a JSON object")
    simple = {
        "name": (lambda v: isinstance(v, str) and bool(NAME.match(v)), "lower-case letters, digits, . _ -"),
        "bench": (lambda v: isinstance(v, str) and bool(re.fullmatch(r"bench_\w+\.py", v)), "bench_NAME.py"),
        "area": (lambda v: v in AREAS, ", ".join(AREAS)),
        "figure": (_text, "a non-empty text"),
        "compared": (_text, "a non-empty text"),
        "unit": (lambda v: v in UNITS, ", ".join(UNITS)),
        "n": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a whole number, 1 or more"),
        "median": (_number, "a finite number"),
        "range": (lambda v: isinstance(v, list) and len(v) == 2 and all(map(_number, v)) and v[0] <= v[1],
                  "[low, high], finite numbers, low <= high"),
        "target": (lambda v: v is None or (isinstance(v, dict) and set(v) == {"op", "value"} and v["op"] in OPS
                                           and _number(v["value"])),
                   f"null or {{\"op\": one of {', '.join(OPS)}, \"value\": a finite number}}"),
        "judged_on": (lambda v: v in JUDGED_ON, ", ".join(JUDGED_ON)),
        "met": (lambda v: v is None or isinstance(v, bool), "true, false or null"),
        "note": (lambda v: v is None or _text(v), "null or a non-empty text"),
        "command": (_text, "the command that ran the bench"),
        "machine": (lambda v: isinstance(v, dict), "an object of machine facts"),
        "date": (_iso_date, "a UTC time, YYYY-MM-DDTHH:MM:SSZ"),
    }
    for field, (ok, allowed) in simple.items():
        if field not in rec:
            raise RecordError(f"{source}: field {field!r} is missing")
        if not ok(rec[field]):
            raise _refuse(source, field, rec[field], allowed)
    low, high = rec["range"]
    if not low <= rec["median"] <= high:
        raise _refuse(source, "median", rec["median"], f"a value inside its range {rec['range']}")
    target = rec["target"]
    if target is None and rec["met"] is not None:
        raise _refuse(source, "met", rec["met"], "null: the figure has no target")
    if target is not None:
        judged = rec["median"] if rec["judged_on"] == "median" else (low if target["op"] in (">=", ">") else high)
        met = OPS[target["op"]](judged, target["value"])
        if rec["met"] is not met:
            raise _refuse(source, "met", rec["met"], f"{str(met).lower()}: the {rec['judged_on']} {judged} against "
                                                      f"{target['op']} {target['value']}")
    facts = {"cpus": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
             "torch": _text, "load_1min": lambda v: v is None or _number(v)}
    for field, ok in facts.items():
        if field not in rec["machine"]:
            raise RecordError(f"{source}: field 'machine.{field}' is missing")
        if not ok(rec["machine"][field]):
            raise _refuse(source, f"machine.{field}", rec["machine"][field], "see bench/figures.py machine()")


def _iso_date(value: Any) -> bool:
    if not isinstance(value, str) or not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", value):
        return False
    try:
        datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return False
    return True


def read_records(folder: Path) -> list[dict[str, Any]]:
    """Every record in ``folder``, checked; RecordError on the first bad one (the page is never half true)."""
    records = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except ValueError as exc:
            raise RecordError(f"{path}: not JSON ({exc})") from None
        validate(rec, str(path))
        records.append(rec)
    return records


def makefile_benches(makefile: Path = PROJECT / "Makefile") -> list[str]:
    """The bench scripts the Makefile's bench target runs, in its order."""
    text = makefile.read_text()
    found = re.search(r"^bench:.*\n((?:\t.*\n?)+)", text, re.M)
    return re.findall(r"bench/(bench_\w+\.py)", found.group(1)) if found else []


# ---------------------------------------------------------------------------------------------------- the page

def _cell(text: str) -> str:
    """Text in a table cell: a pipe would end the cell, < and * would be read as HTML and emphasis; `code` kept."""
    return markdown_cell(text)


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _machine_text(m: dict[str, Any]) -> str:
    cpus = f"{m['cpus']} CPU cores" + (f" ({m['cpu_model']})" if m.get("cpu_model") else "")
    if m.get("usable_cpus") and m["usable_cpus"] != m["cpus"]:
        cpus += f", {m['usable_cpus']} usable"
    gpu = m["gpu"] if m.get("gpu") else "no GPU"
    text = f"{cpus}, {gpu}, torch {m['torch']}, Python {m.get('python', '?')}"
    return _cell(text)


def _key(m: dict[str, Any]) -> tuple:
    return (m["cpus"], m.get("cpu_model"), m.get("gpu"), m["torch"], m.get("python"))


def render(records: list[dict[str, Any]], benches: list[str], results: Path = RESULTS) -> str:
    """The page: its header (who wrote it, when, on what), a table per area, what is not recorded, GPU reports."""
    machines: dict[tuple, str] = {}
    for rec in sorted(records, key=lambda r: r["date"]):
        machines.setdefault(_key(rec["machine"]), f"M{len(machines) + 1}")
    dates = sorted(rec["date"] for rec in records)
    lines = ["<!-- Written by `make bench` (bench/figures.py) from the benches' records in bench/records/: do not "
             "edit; run the benches, then `python bench/figures.py --page docs/pages/figures.md`. -->",
             f"<!-- records shown: {' '.join(sorted(r['name'] for r in records))} -->", "",
             "# Measured figures", ""]
    if records:
        span = dates[0][:10] if dates[0][:10] == dates[-1][:10] else f"{dates[0][:10]} to {dates[-1][:10]}"
        lines += [f"Written by `make bench` from the records of {len(records)} figures measured {span} (UTC) on "
                  f"{'this machine' if len(machines) == 1 else f'{len(machines)} machines'}:", ""]
        for key, label in machines.items():
            loads = [r["machine"]["load_1min"] for r in records if _key(r["machine"]) == key
                     and r["machine"].get("load_1min") is not None]
            cpus = key[0]
            load = ""
            if loads:
                load = (f"; load average {min(loads):.1f} to {max(loads):.1f} when its figures were recorded"
                        + (f" (more than its {cpus} cores: other work shared the machine, so its figures are "
                           "noisier than an idle machine's: their rows say so; quote an idle machine's `make bench`)"
                           if max(loads) > cpus else ""))
            example = next(r for r in records if _key(r["machine"]) == key)["machine"]
            lines.append(f"- **{label}**: {_machine_text(example)}{load}")
        lines.append("")
    else:
        lines += ["Written by `make bench`: no bench has recorded a figure yet.", ""]
    lines += ["Each figure is what its bench prints as its summary: most are ratios against a baseline measured in the "
              "same run, the two sides interleaved A B A B, quoted as the median of the per-round figures with their "
              "range over n rounds (or over the log windows or ranks its *compared* column names). A bench run with "
              "shorter settings than its defaults (its *run with* column) has fewer rounds: read those figures as "
              "indications. \"met\" is judged as the bench judges it, on the median unless the target says *worst "
              "round*.", ""]
    for area, title in AREAS.items():
        rows = sorted((r for r in records if r["area"] == area), key=lambda r: (benches.index(r["bench"])
                                                                               if r["bench"] in benches else 99,
                                                                               r["name"]))
        if not rows:
            continue
        lines += [f"## {title}", "", "| figure | compared | target | measured: median [range] | n | met | run with "
                  "| date (UTC), machine |", "| --- | --- | --- | --- | ---: | --- | --- | --- |"]
        for r in rows:
            lines.append("| " + " | ".join(_row(r, machines[_key(r["machine"])])) + " |")
        lines.append("")
    recorded = {r["bench"] for r in records}
    missing = [b for b in benches if b not in recorded]
    if missing:
        lines += ["## Not recorded yet", "",
                  "These benches of `make bench` have no record here yet (run them, then write the page again): "
                  + ", ".join(f"`bench/{b}`" for b in missing) + ".", ""]
    lines += _gpu_reports(results)
    return "\n".join(lines).rstrip("\n") + "\n"


def _row(r: dict[str, Any], machine_label: str) -> list[str]:
    unit = UNITS[r["unit"]]
    target = r["target"]
    target_text = "for reference"
    if target:
        target_text = f"{OP_TEXT[target['op']]} {_num(target['value'])}{unit}"
        if r["judged_on"] == "worst":
            target_text += ", worst round"
    low, high = r["range"]
    measured = f"**{_num(r['median'])}{unit}** [{_num(low)} to {_num(high)}]"
    met = {True: "yes", False: "**no**", None: "–"}[r["met"]]
    args = r["command"].split(f"bench/{r['bench']}", 1)[-1].strip()
    figure = _cell(r["figure"]) + (f" ({_cell(r['note'])})" if r["note"] else "")
    return [figure, _cell(r["compared"]), target_text, measured, str(r["n"]), met,
            markdown_code(args) if args else "defaults",
            f"{r['date'][:10]} {r['date'][11:16]}, {machine_label}" + _load(r["machine"])]


def _load(m: dict[str, Any]) -> str:
    """The load when the figure was recorded, where it was more than the cores: the figure shared the machine."""
    load = m.get("load_1min")
    return f", load {load:.1f} on {m['cpus']} cores" if load is not None and load > m["cpus"] else ""


def _gpu_reports(results: Path) -> list[str]:
    """One line per GPU check report in bench/results/ (their folders are committed; the site shows their path)."""
    rows = []
    for report in sorted(results.glob("*/gpu_check.json")):
        try:
            data = json.loads(report.read_text())
        except (OSError, ValueError):
            continue
        tests = data.get("tests", {}).get("counts", {})
        bench = data.get("benchmark") or {}
        headline = (f"{bench['tokens_per_s']:,.0f} tokens/s, {100 * bench['mfu']:.1f}% MFU"
                    if bench.get("status") == "ok" and "tokens_per_s" in bench and "mfu" in bench
                    else _cell(str(bench.get("status", "no benchmark"))))
        rows.append(f"| `bench/results/{report.parent.name}/` | {_cell(str(data.get('date_utc', '?')))} | "
                    f"{_cell(str(data.get('device', '?')))} | {'OK' if data.get('ok') else 'not OK'} | "
                    + ", ".join(f"{n} {k}" for k, n in tests.items() if n) + f" | {headline} |")
    if not rows:
        return []
    return ["## GPU check reports", "",
            "Each is one run of `bench/gpu_check.sh` on a lent GPU machine, committed as it came back "
            "(`gpu_check.md` to read; `bench/results/README.md` says what followed from each). Their figures are "
            "absolute, not ratios: see [On a GPU box](gpu.md).", "",
            "| report | date | device | overall | GPU tier | benchmark |", "| --- | --- | --- | --- | --- | --- |",
            *rows, ""]


def dropped(old_page: str, records: list[dict[str, Any]]) -> str | None:
    """What writing the page from ``records`` would take off ``old_page``, in words; None when nothing."""
    listed = SHOWN.search(old_page)
    if listed:
        gone = sorted(set(listed.group(1).split()) - {r["name"] for r in records})
        benches = sorted({f"bench/bench_{name.split('.')[0]}.py" for name in gone})
        return f"{len(gone)} figures it shows ({', '.join(gone)}) of {', '.join(benches)}" if gone else None
    # a page written before it listed them: its figure rows, the tables before the sections that are not figures
    tables = old_page.split("\n## Not recorded yet")[0].split("\n## GPU check reports")[0]
    rows = sum(line.startswith("| ") and not line.startswith(("| figure |", "| --- |")) for line in tables.splitlines())
    return f"{rows - len(records)} of the {rows} figures it shows" if rows > len(records) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--page", type=Path, default=PAGE,
                        help=f"the page to write (default {PAGE.relative_to(PROJECT)})")
    parser.add_argument("--records", type=Path,
                        default=Path(os.environ.get("TRAINBOOK_BENCH_RECORDS") or RECORDS), help="the records' folder")
    parser.add_argument("--drop-missing", action="store_true",
                        help="write the page even where it loses figures whose records are not in the folder")
    args = parser.parse_args(argv)
    try:
        records = read_records(args.records)
    except RecordError as exc:
        print(f"figures: {exc}", file=sys.stderr)
        return 1
    lost = None if args.drop_missing or not args.page.exists() else dropped(args.page.read_text(), records)
    if lost:
        print(f"figures: writing {args.page} from the records in {args.records} would drop {lost}. Records are this "
              "checkout's (git ignores them): run those benches here first (`make bench` runs them all), or pass "
              "--drop-missing to write the page without them. The page is unchanged.", file=sys.stderr)
        return 1
    args.page.write_text(render(records, makefile_benches()))
    print(f"figures: {len(records)} records -> {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
