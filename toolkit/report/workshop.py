"""Workshop mode: the same notebooks for N participants, as papermill batch runs, and one report comparing them.

    python -m toolkit workshop run --participants 4 --params workshop.yaml [--notebook 03_training]

``workshop.yaml`` is a list of parameter sets, one per participant (different seeds or configs), e.g.

    - {config: tiny, steps: 200, overrides: ["train.seed=1"]}
    - {config: tiny, steps: 200, overrides: ["train.seed=2", "optim.lr=3e-3"]}

Each participant gets its own folder (executed notebook, runs, workspace) and its own papermill process; as
many run at once as there are cores, and each training run is given cores / parallel threads, because two
2-thread torch processes on 2 cores slow each other down many times over. The report is a table and a picture
of every participant's validation curve.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from toolkit.config import ConfigError
from toolkit.errors import not_allowed
from toolkit.report.demo import NOTEBOOKS, run_summary
from toolkit.tables import Column, text_table


@dataclass
class ParticipantResult:
    index: int
    parameters: dict
    status: str
    seconds: float
    folder: Path
    runs: list[dict]


def read_parameter_sets(path: str | Path, participants: int, notebook: Path) -> list[dict]:
    """The first ``participants`` parameter sets of the file, each checked against the notebook's parameters."""
    import papermill

    if participants < 1:
        raise ConfigError(not_allowed("--participants", participants, "1 or more"))
    path = Path(path)
    try:
        sets = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            not_allowed("--params", path, "a YAML list of parameter sets", problem="does not exist")
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--params: {str(path)!r} is not valid YAML ({exc})") from None
    if not isinstance(sets, list) or not all(isinstance(s, dict) for s in sets):
        raise ConfigError(
            not_allowed(
                "--params",
                path,
                "a YAML list of mappings, one parameter set per participant",
                problem=f"holds a {type(sets).__name__}",
            )
        )
    if len(sets) < participants:
        raise ConfigError(
            not_allowed(
                "--participants",
                participants,
                f"1 to {len(sets)}",
                problem=f"is more than the {len(sets)} parameter sets in {path}",
            )
        )
    declared = papermill.inspect_notebook(str(notebook))
    for i, params in enumerate(sets[:participants]):
        unknown = sorted(set(params) - set(declared))
        if unknown:
            raise ConfigError(
                not_allowed(
                    f"--params: participant {i + 1}",
                    unknown[0],
                    ", ".join(sorted(declared)),
                    problem=f"is not a parameter of {notebook.name}",
                )
            )
        _check_training(i + 1, params, declared)
    return sets[:participants]


# A notebook parameter -> the config field the notebook sets from it (03 and 04 train from these)
TRAINING_PARAMETERS = {
    "engine": "engine.name",
    "nproc": "engine.nproc",
    "steps": "train.max_steps",
    "every": "checkpoint.every_steps",
}


def _check_training(participant: int, params: dict, declared: dict) -> None:
    """Build the config a parameter set trains with, as `trainbook train` would, so that a bad config name,
    override or value is refused before any participant starts (not found afterwards in one papermill.log)."""
    from toolkit import config as config_mod

    if "config" not in declared:
        return
    where = f"--params: participant {participant}"
    overrides = params.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError(not_allowed(f"{where}: overrides", overrides, 'a list of "section.field=value" strings'))
    overrides = [
        *overrides,
        *(f"{field}={params[name]}" for name, field in TRAINING_PARAMETERS.items() if params.get(name) is not None),
    ]
    config = params.get("config", yaml.safe_load(declared["config"]["default"]))
    try:
        config_mod.load(config, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _notebook(name: str) -> Path:
    found = sorted(NOTEBOOKS.glob(f"{name}*.ipynb"))
    if not found:
        shipped = ", ".join(p.stem for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
        raise ConfigError(not_allowed("--notebook", name, shipped, problem="matches no notebook"))
    return found[0]


def _run_one(index: int, params: dict, notebook: Path, out: Path, threads: int) -> ParticipantResult:
    folder = out / f"participant-{index + 1:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    params = {**params, "runs_root": str(folder / "runs")}
    if "overrides" in _declared(notebook):
        params["overrides"] = [*params.get("overrides", []), f"train.threads={threads}"]
    (folder / "parameters.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "TRAINBOOK_WORKSPACE": str(folder / "workspace"), "OMP_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "papermill",
            str(notebook),
            str(folder / notebook.name),
            "-f",
            str(folder / "parameters.yaml"),
            "--cwd",
            str(NOTEBOOKS),
            "--no-progress-bar",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    (folder / "papermill.log").write_text(proc.stdout + proc.stderr)
    return ParticipantResult(
        index + 1,
        params,
        "ok" if proc.returncode == 0 else "FAILED",
        time.perf_counter() - t0,
        folder,
        run_summary(folder / "runs"),
    )


def _declared(notebook: Path) -> dict:
    import papermill

    return papermill.inspect_notebook(str(notebook))


def run_workshop(
    participants: int,
    params_file: str | Path,
    notebook: str = "03_training",
    out: str | Path | None = None,
    parallel: int | None = None,
) -> list[ParticipantResult]:
    """Run the notebook once per participant, ``parallel`` at a time (default: the core count)."""
    from toolkit.paths import PROJECT_ROOT

    nb = _notebook(notebook)
    sets = read_parameter_sets(params_file, participants, nb)
    from toolkit.machine import usable_cores

    cores = usable_cores()
    parallel = parallel or min(cores, participants)
    if parallel < 1:
        raise ConfigError(not_allowed("--parallel", parallel, "1 or more"))
    out = Path(out) if out else PROJECT_ROOT / "outputs" / f"workshop-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    threads = max(1, cores // parallel)  # never more busy threads than cores
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(lambda item: _run_one(item[0], item[1], nb, out, threads), enumerate(sets)))
    write_report(results, out)
    return results


def report_table(results: list[ParticipantResult]) -> str:
    def last_run(key: str):
        return lambda r: r.runs[-1].get(key) if r.runs else None

    return text_table(
        results,
        [
            Column("participant", "index"),
            Column("status", "status"),
            Column("seconds", "seconds", ".0f", right=True),
            Column("steps", lambda r: last_run("steps")(r) or None, right=True),
            Column("val bpb", last_run("val_bpb"), ".3f", right=True),
            Column("tokens/s", last_run("tokens_per_s"), ",.0f", right=True),
            Column("parameters", lambda r: json.dumps({k: v for k, v in r.parameters.items() if k != "runs_root"})),
        ],
    )


def write_report(results: list[ParticipantResult], out: Path) -> Path:
    """report.md (the table), report.json, and report.png (every participant's validation curve)."""
    from toolkit.report import plots
    from toolkit.events import EvalEvent, read_events

    (out / "report.json").write_text(
        json.dumps([{**r.__dict__, "folder": str(r.folder)} for r in results], indent=1, default=str)
    )
    curves = {}
    for r in results:
        for run in r.runs:
            evals = read_events(r.folder / "runs" / run["run"], EvalEvent)
            if evals:
                curves[f"participant {r.index}"] = [(e.step, e.headline) for e in evals]
    picture = (
        plots.compare_curves(curves, out / "report.png", "Validation bits per byte by participant") if curves else None
    )
    text = f"# Workshop report\n\n```\n{report_table(results)}\n```\n"
    if picture:
        text += f"\n![validation curves]({picture.name})\n"
    (out / "report.md").write_text(text)
    return out / "report.md"


def main_run(args) -> int:
    results = run_workshop(args.participants, args.params, notebook=args.notebook, out=args.out, parallel=args.parallel)
    print(report_table(results))
    print(f"\nreport: {Path(results[0].folder).parent / 'report.md'}")
    return 0 if all(r.status == "ok" for r in results) else 1
