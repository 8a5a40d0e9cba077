"""``make demo``: execute every guided notebook headlessly with papermill, then print the figures.

Executed copies go to outputs/ (ignored by git), runs to outputs/runs/. A failing notebook stops the demo
with the cell that failed; its partial output is still written for inspection.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from toolkit.paths import PROJECT_ROOT
from toolkit.rundir import RunDir

NOTEBOOKS = PROJECT_ROOT / "notebooks"
OUTPUTS = PROJECT_ROOT / "outputs"


def guided_notebooks() -> list[Path]:
    """The course notebooks in order: 00_*.ipynb, 01_*.ipynb, ..."""
    return sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def execute(notebook: Path, out_dir: Path, parameters: dict) -> Path:
    """Run ``notebook`` with papermill into ``out_dir``; parameters it does not declare are left out (papermill
    would inject them anyway, with a warning), so the demo can offer every notebook the same settings."""
    import papermill

    declared = papermill.inspect_notebook(str(notebook))
    parameters = {k: v for k, v in parameters.items() if k in declared}
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / notebook.name
    papermill.execute_notebook(str(notebook), str(out), parameters=parameters, cwd=str(NOTEBOOKS),
                               kernel_name="python3", progress_bar=False)
    return out


def run_summary(runs: Path) -> list[dict]:
    """One row per run under ``runs``: final validation figure, throughput and MFU in steady state."""
    rows = []
    for path in sorted(p for p in runs.glob("*") if (p / "status.json").exists()):
        run = RunDir(path)
        status, train = run.read_status(), run.events("train")
        final = (run.events("status") or [{}])[-1]
        tail = train[len(train) // 2:] or train
        rows.append({
            "run": path.name, "state": status.get("state"), "steps": status.get("step"),
            "val_bpb": final.get("val_bpb"), "val_loss": final.get("val_loss"),
            "train_s": final.get("train_seconds"),
            "tokens_per_s": sum(e["tokens_per_s"] for e in tail) / len(tail) if tail else None,
            "mfu": sum(e["mfu"] for e in tail) / len(tail) if tail else None,
        })
    return rows


def _fmt(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(OUTPUTS), help="where executed notebooks and runs go")
    parser.add_argument("--only", action="append", help="run only notebooks whose name contains this")
    args = parser.parse_args(argv)
    out_dir = Path(args.out).resolve()
    runs = out_dir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    os.environ["TRAINBOOK_WORKSPACE"] = str(out_dir / "workspace")  # one workspace for every notebook and run
    notebooks = [nb for nb in guided_notebooks() if not args.only or any(s in nb.name for s in args.only)]
    timings = []
    for nb in notebooks:
        print(f"[demo] {nb.name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            # the workspace comes from TRAINBOOK_WORKSPACE; each notebook takes the settings it declares
            execute(nb, out_dir, {"runs_root": str(runs), "plan_dir": str(out_dir / "azure-plan")})
        except Exception as exc:  # papermill's PapermillExecutionError names the cell and the traceback
            print(f"[demo] {nb.name} FAILED: {exc}\n[demo] partial output: {out_dir / nb.name}", file=sys.stderr)
            return 1
        timings.append((nb.name, time.perf_counter() - t0))
        print(f"[demo] {nb.name} done in {timings[-1][1]:.0f} s -> {out_dir / nb.name}", flush=True)

    print("\nnotebook                         seconds")
    for name, seconds in timings:
        print(f"{name:<32} {seconds:7.0f}")
    rows = run_summary(runs)
    if rows:
        print(f"\n{'run':<34} {'state':<10} {'steps':>6} {'val bpb':>8} {'train s':>8} {'tokens/s':>9} {'MFU':>6}")
        for r in rows:
            print(f"{r['run']:<34} {r['state'] or '-':<10} {_fmt(r['steps'], 'd'):>6} {_fmt(r['val_bpb'], '.3f'):>8} "
                  f"{_fmt(r['train_s'], '.0f'):>8} {_fmt(r['tokens_per_s'], ',.0f'):>9} "
                  f"{_fmt(r['mfu'] and 100 * r['mfu'], '.1f'):>5}%")
    (out_dir / "summary.json").write_text(json.dumps({"notebooks": timings, "runs": rows}, indent=1))
    print(f"\nexecuted notebooks and runs: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
