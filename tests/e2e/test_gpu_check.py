"""The GPU machine's prepared check (bench/gpu_check.sh), run where it can be: on this CPU machine. It must end in
seconds with a report that says there is no CUDA device, say which packages it could not install when the wheels
are missing, note an empty GPU tier, and still report when stopped from outside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile

import pytest
import torch

from conftest import PROJECT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine runs the real check, not this one")]

REPORT_KEYS = {"date_utc", "device", "cuda_available", "python", "versions", "install", "tests", "benchmark", "steps",
               "notes", "ok"}


def check_env(out, **settings) -> dict:
    return {**os.environ, "OUT": str(out), "PYTHON": sys.executable, **settings}


def run_check(out, timeout=90, **settings) -> tuple[subprocess.CompletedProcess, dict, str]:
    done = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=PROJECT, env=check_env(out, **settings),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md").read_text()


@pytest.fixture(scope="module")
def default_check(tmp_path_factory):
    """The check as the device machine runs it, with no setting changed: run once for the tests that read it."""
    out, private = tmp_path_factory.mktemp("default-check"), tmp_path_factory.mktemp("default-check-home")
    t0 = time.monotonic()
    # built before each test's private_workspace: a workspace and user config of its own, as that fixture gives
    done, report, md = run_check(out, TRAINBOOK_WORKSPACE=str(private / "workspace"),
                                 TRAINBOOK_CONFIG_HOME=str(private / "user-config"))
    return done, report, md, out, time.monotonic() - t0


def test_on_a_cpu_machine_the_check_ends_within_a_minute_and_says_no_cuda_device(default_check):
    done, report, md, out, seconds = default_check
    assert seconds < 60
    assert REPORT_KEYS <= set(report)
    assert report["device"] == "no CUDA device" and report["cuda_available"] is False
    assert "no CUDA device" in md and "no CUDA device" in done.stdout
    assert report["benchmark"]["status"] == "no CUDA device"
    assert report["versions"]["torch"] == torch.__version__
    assert [s["name"] for s in report["steps"]] == ["install", "facts", "gpu tier", "benchmark"]
    assert report["steps"][0]["rc"] == 0 and report["steps"][-1]["rc"] == 0
    assert report["install"]["missing"] == {}, "this venv has everything the GPU machine lacks"
    # what comes back from the device machine: a few files, no folders
    assert {"gpu_check.json", "gpu_check.log", "gpu_check.md"} <= {p.name for p in out.iterdir()} <= {
        "gpu_check.json", "gpu_check.log", "gpu_check.md", "gpu_tests.xml"}
    assert report["tests"]["status"] in ("all skipped", "skipped (tests/gpu does not exist: there is no GPU tier to "
                                                        "run)")
    # the host's speed, so that two reports' eager (launch-bound) figures can be compared: the figure make test
    # ends with, a fresh process importing torch and torch._dynamo, in CPU seconds
    host = report["facts"]["host"]
    assert isinstance(host["import_torch_cpu_s"], float) and 0.1 < host["import_torch_cpu_s"] < 15, host
    assert host["cores"] >= 1, host
    assert f"imports torch and torch._dynamo in {host['import_torch_cpu_s']:.2f} s of CPU" in md


def test_without_the_wheels_it_names_what_is_missing_and_goes_on(tmp_path):
    """And, in the same run, a lease's second command (GPU_TIER=none GPU_COMPARISONS=...): without CUDA every
    comparison is skipped with its reason, and the tier says it was left out on purpose."""
    listed = tmp_path / "wheels.txt"
    listed.write_text("xxhash\ntrainbook-no-such-package  # nothing installs it here\n")
    out = tmp_path / "out"
    done, report, md = run_check(out, GPU_WHEELS=str(tmp_path / "no-wheels"), GPU_WHEELS_LIST=str(listed),
                                 GPU_TIER="none", GPU_COMPARISONS="hf zero")
    install = report["install"]
    assert install["wheels_dir_found"] is False
    assert install["missing"] == {"trainbook-no-such-package": "no wheels folder"}
    assert "xxhash" in install["present"]
    assert "NOT FOUND" in md and "**missing**: trainbook-no-such-package" in md and "make gpu-wheels" in md
    assert report["ok"] is False, "a missing package is a finding"
    assert report["benchmark"]["status"] == "no CUDA device", "the steps after it still ran"
    assert "gpu tier skipped: GPU_TIER=none" in report["notes"]
    assert [n for n in report["notes"] if n.startswith("comparison")] == [
        "comparison hf skipped: no CUDA device", "comparison zero skipped: no CUDA device"]
    assert "| comparison hf | skipped |" in md


def test_the_default_tier_runs_training_first_and_deepspeed_last(default_check):
    """The targets (training, then serving) come first: the budget's cut-off falls on DeepSpeed's op builds, which a
    second command reruns (an H200 run of 2026-11-28 ran the model-parallel and serving files first, then lost all
    of DeepSpeed's tests to the cut-off)."""
    _, report, _, _, _ = default_check
    files = list(dict.fromkeys(case["test"].split("::")[0] for case in report["tests"]["cases"]))
    assert files[:2] == ["tests.gpu.test_gpu_training", "tests.gpu.test_gpu_serving"], files
    assert files[-1] == "tests.gpu.test_gpu_deepspeed", files
    assert len(files) == len(list((PROJECT / "tests" / "gpu").glob("test_gpu_*.py"))), files


def test_without_the_benchmark_the_tier_has_the_budget_the_benchmark_would_have_kept(tmp_path):
    """GPU_BENCH_SECONDS=0 (a lease's second command, rerunning DeepSpeed's file): nothing is held back for a
    benchmark that will not run, so a 150 s budget still runs the tier; the benchmark says it was left out."""
    tier = tmp_path / "tier"
    tier.mkdir()
    (tier / "test_marked.py").write_text("import pytest\n\n@pytest.mark.gpu\ndef test_on_the_gpu():\n    pass\n")
    _, report, _ = run_check(tmp_path / "out", GPU_TIER=str(tier), GPU_BENCH_SECONDS="0", GPU_CHECK_SECONDS="150")
    assert [s["name"] for s in report["steps"]][:3] == ["install", "facts", "gpu tier"]
    tier_step = report["steps"][2]
    assert tier_step["rc"] == 0 and report["tests"]["counts"]["passed"] == 1, report["notes"]
    assert "benchmark skipped: GPU_BENCH_SECONDS=0" in report["notes"]


def test_a_gpu_tier_that_collects_nothing_is_a_note_not_a_failure(tmp_path):
    tier = tmp_path / "tier"
    tier.mkdir()
    (tier / "test_cpu_only.py").write_text("def test_not_marked_gpu():\n    pass\n")
    _, report, md = run_check(tmp_path / "out", GPU_TIER=str(tier))
    assert report["tests"]["status"] == "no tests collected" and report["tests"]["exit_code"] == 5
    assert any("collected no test" in note for note in report["notes"])
    assert "## GPU tier: no tests collected" in md
    assert report["ok"] is True


def test_stopped_from_outside_it_still_writes_its_report(tmp_path):
    tier = tmp_path / "tier"
    tier.mkdir()
    started = tmp_path / "started"
    (tier / "test_slow.py").write_text(f"import pathlib, time, pytest\n\n@pytest.mark.gpu\ndef test_hangs():\n"
                                       f"    pathlib.Path({str(started)!r}).touch()\n    time.sleep(120)\n")
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", "bench/gpu_check.sh"], cwd=PROJECT, env=check_env(out, GPU_TIER=str(tier)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not started.exists():  # pytest is in the hanging test
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, output
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["tests"]["status"] == "interrupted"
    assert any("stopped early (exit status 143)" in note for note in report["notes"])
    assert report["benchmark"] == {"status": "not run"}


def test_the_benchmarks_gpu_path_runs_on_the_cpu_and_its_figures_reach_the_report(tmp_path):
    """bench_gpu.py --device cpu: the same loop at a tiny shape, so a mistake in it shows here, not in GPU time;
    and the report's benchmark table, which only a GPU fills, renders from its result."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    subprocess.run([sys.executable, "bench/bench_gpu.py", "--device", "cpu", "--seconds", "1", "--batch", "2",
                    "--json", str(work / "bench.json")], cwd=PROJECT, check=True, timeout=120)
    bench = json.loads((work / "bench.json").read_text())
    assert bench["status"] == "ok" and bench["steps"] >= 10 and bench["tokens_per_s"] > 0
    assert bench["tokens_per_step"] == 2 * 64 and bench["mfu"] is None and bench["final_loss"] < 6
    (work / "steps.tsv").write_text("benchmark\t0\t3.0\n")
    subprocess.run([sys.executable, "bench/gpu_report.py", "--work", str(work), "--out", str(out)], cwd=PROJECT,
                   check=True, timeout=60)
    md = (out / "gpu_check.md").read_text()
    assert "## Benchmark: ok" in md and f"| tokens/s | {bench['tokens_per_s']:,} |" in md
    assert "| MFU (datasheet dense bf16 peak) | n/a |" in md
    compiled = bench["compiled"]  # the same loop compiled in place, timed in turns with eager
    assert compiled["steps"] >= 10 and compiled["compile_s"] > 0 and compiled["over_eager_median"] > 0
    assert f"| compiled / eager, median (range) | {compiled['over_eager_median']} (" in md
    assert json.loads((out / "gpu_check.json").read_text())["benchmark"] == bench


def test_without_pip_a_wheel_is_unpacked_where_it_imports_and_its_scripts_run(tmp_path):
    """gpu_install.py's last resort on an image with no pip at all (not even ensurepip)."""
    sys.path.insert(0, str(PROJECT / "bench"))
    try:
        import gpu_install
    finally:
        sys.path.remove(str(PROJECT / "bench"))
    wheel = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo_pkg/__init__.py", "VALUE = 42\n")
        archive.writestr("demo_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
        archive.writestr("demo_pkg-1.0.data/scripts/demo-tool", "#!python\nprint('tool ran')\n")
        archive.writestr("demo_pkg-1.0.data/headers/demo.h", "")
    site, bindir = tmp_path / "site", tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    gpu_install.unzip_install(site, bindir, [wheel])
    env = {**os.environ, "PYTHONPATH": str(site)}
    code = "import demo_pkg, importlib.metadata as m; print(demo_pkg.VALUE, m.version('demo-pkg'))"
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.split() == ["42", "1.0"]
    assert subprocess.run([bindir / "demo-tool"], capture_output=True, text=True, check=True).stdout == "tool ran\n"
    assert not (site / "demo.h").exists() and not (tmp_path / "demo.h").exists()
