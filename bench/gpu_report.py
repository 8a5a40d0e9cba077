"""The GPU check's one report: what bench/gpu_check.sh's steps left behind, merged into gpu_check.json and
gpu_check.md.

    python bench/gpu_report.py --work DIR --out DIR [--junit FILE]

Reads from --work: facts.json (bench/gpu_facts.py), install.json (bench/gpu_install.py), bench.json
(bench/bench_gpu.py), figures.json (the GPU tier's, through $TRAINBOOK_FIGURES), steps.tsv (step, exit status,
seconds, why skipped; written by the shell) and notes.txt (one note a line); --junit is pytest's JUnit XML of the GPU
tier, whose test properties are the figures each test measured. Any of them may be missing (a step that failed or
never ran): the report says so. Standard library only, so it runs on any Python, even one without torch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

PYTEST_EXIT = {0: "passed", 1: "some tests failed", 2: "interrupted", 3: "internal error", 4: "usage error",
               5: "no tests collected", 124: "timed out", 130: "interrupted", 137: "killed (time limit)"}


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_steps(path: Path) -> list[dict]:
    steps = []
    if path.exists():
        for line in path.read_text().splitlines():
            name, rc, seconds, why = (line.split("\t") + ["", "", "", ""])[:4]
            steps.append({"name": name, "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                          "seconds": float(seconds) if seconds else None, "skipped": why or None})
    return steps


def read_junit(path: Path | None) -> list[dict]:
    """One entry per test case: its name, outcome (passed, failed, error, skipped) and the reason pytest gave."""
    if not path or not path.exists():
        return []
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                reason = (found.get("message") or found.text or "").strip()
                break
        figures = {p.get("name"): p.get("value") for p in case.iter("property")}
        cases.append({"test": f"{case.get('classname', '')}::{case.get('name', '')}".strip(":"), "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0), 2), "reason": reason[:500], "figures": figures})
    return cases


def tests_section(steps: list[dict], cases: list[dict]) -> dict:
    step = next((s for s in steps if s["name"] == "gpu tier"), None)
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    if step is None:
        status = "not run"
    elif step["rc"] is None:
        status = f"skipped ({step['skipped']})" if step.get("skipped") else "skipped"
    elif step["rc"] == 0 and cases and counts["skipped"] == len(cases):
        status = "all skipped"
    else:
        status = PYTEST_EXIT.get(step["rc"], f"pytest exit status {step['rc']}")
    return {"status": status, "exit_code": step["rc"] if step else None, "seconds": step["seconds"] if step else None,
            "counts": counts, "cases": cases}


def build(work: Path, junit: Path | None) -> dict:
    facts = read_json(work / "facts.json") or {}
    install = read_json(work / "install.json")
    bench = read_json(work / "bench.json")
    steps = read_steps(work / "steps.tsv")
    notes = [n for n in (work / "notes.txt").read_text().splitlines() if n] if (work / "notes.txt").exists() else []
    tests = tests_section(steps, read_junit(junit))
    device = facts.get("device") or (bench or {}).get("device") or "no CUDA device"
    if install is None:
        notes.append("the install step left no record")
    if bench is None:
        notes.append("the benchmark left no result")
    failed = tests["counts"]["failed"] + tests["counts"]["error"] > 0 or tests["status"] in (
        "timed out", "killed (time limit)", "internal error", "usage error", "interrupted")
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device,
        "cuda_available": bool(facts.get("cuda_available")),
        "python": facts.get("python"),
        "versions": facts.get("versions", {}),
        "facts": facts,
        "install": install or {},
        "tests": tests,
        "figures": read_json(work / "figures.json") or {},
        "benchmark": bench or {"status": "not run"},
        "steps": steps,
        "notes": notes,
        # ok: the check itself found nothing wrong (no CUDA device is not a failure of the code: it says so above)
        "ok": not failed and (bench or {}).get("status") in ("ok", "no CUDA device")
              and not (install or {}).get("missing"),
    }


def cell(text) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def markdown(r: dict) -> str:
    f, v, ins, t, b = r["facts"], r["versions"], r["install"], r["tests"], r["benchmark"]
    out = [f"# GPU check, {r['date_utc']}", ""]
    if r["cuda_available"]:
        out.append(f"**Device: {r['device']}** ({f.get('memory_gib')} GiB, compute capability {f.get('capability')}, "
                   f"{f.get('device_count')} visible); nvidia-smi: {f.get('nvidia_smi') or 'absent'}")
    else:
        out.append(f"**Device: no CUDA device**{': ' + f['reason'] if f.get('reason') else ''}; the GPU tier skips "
                   "and the benchmark has no figures.")
    out.append("")
    out.append(f"Python {r['python']}, torch's CUDA {f.get('torch_cuda') or 'none'}; "
               + ", ".join(f"{k} {val or 'absent'}" for k, val in v.items()))
    host = f.get("host") or {}
    speed = host.get("import_torch_cpu_s")
    out += ["", f"Host: {host.get('cpu') or 'CPU unknown'}, {host.get('cores') or '?'} usable cores; "
            + (f"a fresh process imports torch and torch._dynamo in {speed:.2f} s of CPU (the host's speed: eager, "
               "launch-bound steps move with it)" if speed is not None
               else f"speed not measured{' (' + host['reason'] + ')' if host.get('reason') else ''}")]
    overall = "ok" if r["ok"] else "NOT OK"
    if not r["cuda_available"]:
        overall += " (no CUDA device: nothing GPU-specific was tested or measured)"
    out += ["", f"Overall: **{overall}**", "", "## Packages", ""]
    if ins:
        out.append(f"Wheels folder {ins.get('wheels_dir')}: {'found' if ins.get('wheels_dir_found') else 'NOT FOUND'}")
        out.append(f"- already there: {', '.join(f'{k} {x}' for k, x in ins.get('present', {}).items()) or 'none'}")
        out.append(f"- installed from the wheels: "
                   f"{', '.join(f'{k} {x}' for k, x in ins.get('installed', {}).items()) or 'none'}")
        missing = ins.get("missing", {})
        out.append(f"- **missing**: {', '.join(f'{k} ({why})' for k, why in missing.items())}" if missing
                   else "- missing: none")
        out += [f"- unmet: {line}" for line in ins.get("pip_check", [])]
        out += [f"- {note}" for note in ins.get("notes", [])]
    else:
        out.append("No record of the install step.")
    c = t["counts"]
    out += ["", f"## GPU tier: {t['status']}", ""]
    if t["exit_code"] is not None:
        out += [f"{c['passed']} passed, {c['failed']} failed, {c['error']} errors, {c['skipped']} skipped in "
                f"{t['seconds']} s", ""]
    if t["cases"]:
        out += ["| test | outcome | seconds | reason |", "| --- | --- | ---: | --- |"]
        out += [f"| {cell(x['test'])} | {x['outcome']} | {x['seconds']} | {cell(x['reason'][:200])} |"
                for x in t["cases"]]
    measured = [(x["test"].rsplit("::", 1)[-1], k, v) for x in t["cases"] for k, v in x.get("figures", {}).items()]
    if measured:
        out += ["", "Figures the GPU tier measured:", "", "| test | figure | value |", "| --- | --- | --- |"]
        out += [f"| {cell(test)} | {cell(k)} | {cell(v)} |" for test, k, v in measured]
    out += ["", f"## Benchmark: {b.get('status')}", ""]
    if b.get("status") == "ok":
        m = b.get("model", {})
        rows = [("model", f"GPT {m.get('n_layer')} x {m.get('n_embd')}, {m.get('n_head')} heads, context "
                          f"{m.get('block_size')}, vocab {m.get('vocab')}, {m.get('parameters', 0) / 1e6:.1f}M params"),
                ("precision", f"{b.get('precision')}, torch.compile: {b.get('compile')}"),
                ("batch", f"{b.get('batch')} x {m.get('block_size')} = {b.get('tokens_per_step')} tokens a step"),
                ("tokens/s", f"{b.get('tokens_per_s'):,}"), ("step, ms", b.get("step_ms")),
                ("timed steps / seconds", f"{b.get('steps')} / {b.get('seconds')}"),
                ("MFU (datasheet dense bf16 peak)", pct(b.get("mfu_vs_datasheet"))),
                ("MFU (measured bf16 matmul peak)", pct(b.get("mfu_vs_measured"))),
                ("bf16 peak, TFLOP/s: datasheet / measured",
                 f"{tflops(b.get('peak_bf16_datasheet_flops'))} / {tflops(b.get('peak_bf16_measured_flops'))}"),
                ("peak memory, GiB", b.get("peak_memory_gib")), ("final loss", b.get("final_loss"))]
        if c := b.get("compiled"):
            lo, hi = c.get("over_eager_range") or (None, None)
            rows += [("compiled: tokens/s", f"{c.get('tokens_per_s'):,}"), ("compiled: step, ms", c.get("step_ms")),
                     ("compiled: MFU (datasheet)", pct(c.get("mfu_vs_datasheet"))),
                     ("compiled / eager, median (range)", f"{c.get('over_eager_median')} ({lo} to {hi})"),
                     ("compile, s", c.get("compile_s"))]
        out += ["| figure | value |", "| --- | --- |"] + [f"| {k} | {cell(val)} |" for k, val in rows]
        out += [f"- {note}" for note in b.get("notes", [])]
    elif b.get("reason"):
        out.append(b["reason"])
    out += ["", "## Steps", "", "| step | exit status | seconds |", "| --- | ---: | ---: |"]
    out += [f"| {s['name']} | {s['rc'] if s['rc'] is not None else 'skipped'} | {s['seconds'] or ''} |"
            for s in r["steps"]]
    if r["notes"]:
        out += ["", "## Notes", ""] + [f"- {n}" for n in r["notes"]]
    return "\n".join(out) + "\n"


def pct(x) -> str:
    return f"{x:.1%}" if isinstance(x, (int, float)) else "n/a"


def tflops(x) -> str:
    return f"{x / 1e12:.0f}" if isinstance(x, (int, float)) else "n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--junit", type=Path)
    args = parser.parse_args()
    report = build(args.work, args.junit)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    (args.out / "gpu_check.md").write_text(markdown(report))
    print(f"report: {args.out / 'gpu_check.md'} and gpu_check.json: device {report['device']}, tests "
          f"{report['tests']['status']}, benchmark {report['benchmark'].get('status')}, ok {report['ok']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
