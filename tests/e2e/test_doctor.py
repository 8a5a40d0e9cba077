"""The doctor (facts and health checks), the all-reduce sweep, environment drift and the memory estimator."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from toolkit.resources import drift
from toolkit.resources.collectives import allreduce_sweep
from toolkit.config import ConfigError
from toolkit.resources.doctor import CHECKS, STATUSES
from toolkit.resources.zero_stages import estimate, model_params, parse_count, recommend_stage

from conftest import cli
from widgets.journey import JourneyPanel


@pytest.mark.slow
def test_the_doctor_passes_on_this_machine_and_reports_every_check(tmp_path):
    proc = cli("doctor", "--json", str(tmp_path / "report.json"), "--workspace", str(tmp_path / "ws"), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["ok"] and [c["name"] for c in report["checks"]] == list(CHECKS)
    assert all(c["status"] in STATUSES and c["summary"] for c in report["checks"])
    facts = report["facts"]
    assert facts["cpu_cores"] == os.cpu_count() and facts["torch"].startswith("2.13.0")
    sweep = next(c for c in report["checks"] if c["name"] == "all-reduce")["details"]
    assert sweep["nproc"] == 2 and len(sweep["rows"]) == 8
    assert all(r["correct"] and r["busbw_gbps"] > 0 for r in sweep["rows"])
    # the printout: a line per check as it lands, the facts, the sweep table, the verdict
    for name in CHECKS:
        assert f"\n{name} " in "\n" + proc.stdout
    assert "busbw GB/s" in proc.stdout and "all required checks pass" in proc.stdout
    # `make setup` compiled DeepSpeed's shm comm op into the venv: the doctor must find it there
    ops = next(c for c in report["checks"] if c["name"] == "deepspeed-ops")
    assert "not compiled yet" not in ops["summary"], ops["summary"]
    assert "Setting accelerator" not in proc.stdout + proc.stderr  # DeepSpeed's guess, not our users' business
    engines = [c for c in report["checks"] if c["name"].startswith("train-")]
    assert all(len(c["details"]["losses"]) == 3 for c in engines)
    # kept in the workspace, where notebook 00's journey ticks step 01 from it
    journey = JourneyPanel(tmp_path / "ws")
    assert journey.statuses[0][0] and "the doctor passed" in journey.statuses[0][1], journey.statuses[0]


def test_a_partial_doctor_leaves_step_01_to_do(tmp_path):
    journey = JourneyPanel(tmp_path / "ws")
    assert journey.statuses[0] == (False, journey.statuses[0][1]) and "has not checked it yet" in journey.statuses[0][1]
    proc = cli("doctor", "--only", "packages", "--workspace", str(tmp_path / "ws"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done, detail = journey.refresh()[0]
    assert not done and "skipped required checks: matmul, disk, all-reduce, train-torch, train-deepspeed" in detail
    # a report edited by hand (or another version's) is as none, and the table still draws
    for text in ('["ok"]', '{"ok": true, "time": "today", "checks": [], "skipped": []}', '{"checks": [1]'):
        (tmp_path / "ws" / "doctor.json").write_text(text)
        assert journey.refresh()[0] == (False, journey.statuses[0][1]) and "has not checked" in journey.statuses[0][1]


def test_a_full_disk_fails_the_doctor(tmp_path, small_mount):
    with small_mount("-t", "tmpfs", "-o", "size=1m", "tmpfs") as mount:
        proc = cli("doctor", "--only", "disk", "--workspace", str(mount), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    check = json.loads((tmp_path / "r.json").read_text())["checks"][0]
    assert check["status"] == "fail" and "No space left on device" in check["summary"]
    assert "a required check FAILED" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--only", "bogus"], "--only: 'bogus' is not allowed; allowed: packages, gpus"),
    (["--skip", "disk", "--skip", "nope"], "--skip: 'nope' is not allowed"),
    (["--nproc", "1"], "--nproc: 1 is not allowed; allowed: 2 or more"),
])
def test_bad_doctor_arguments(args, message):
    proc = cli("doctor", *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_all_reduce_sweep_checks_its_sums_and_reports_bus_bandwidth():
    result = allreduce_sweep(2, sizes=(4096, 1 << 20))
    assert [r.size_bytes for r in result.rows] == [4096, 1 << 20]
    for r in result.rows:
        assert r.correct and r.iters >= 3
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * 2 * (2 - 1) / 2)  # nccl-tests' all_reduce factor
        assert r.algbw_gbps == pytest.approx(r.size_bytes / (r.time_us / 1e6) / 1e9)
    assert "busbw GB/s" in result.table()
    with pytest.raises(ValueError, match="nproc: 1 is not allowed"):
        allreduce_sweep(1)


def _environment(tmp_path: Path, pip: list[str]) -> Path:
    path = tmp_path / "environment.yml"
    path.write_text("name: t\ndependencies:\n  - python=3.11\n  - pip:\n" + "".join(f"      - {p}\n" for p in pip))
    return path


def test_drift_reports_missing_and_moved_packages(tmp_path):
    import numpy

    env = _environment(tmp_path, ["numpy", "PyYAML>=6", "surely-not-installed-pkg"])
    lock = tmp_path / "constraints.txt"
    lock.write_text(f"# lock\nnumpy=={numpy.__version__}\npyyaml==0.0.1\n")
    states = {s.name: s.status for s in drift.check(env, lock)}
    assert states == {"numpy": "ok", "pyyaml": "drift", "surely-not-installed-pkg": "missing"}


@pytest.mark.parametrize("text, message", [
    ("name: t\ndependencies: [python, {pip: [numpy]\n", "is not valid YAML (line 3"),
    ("name: t\nchannels: [conda-forge]\n", "has no dependencies list"),
    ("name: t\ndependencies: [python=3.11]\n", "has no 'pip:' list"),
])
def test_a_broken_environment_file_is_named(tmp_path, text, message):
    path = tmp_path / "environment.yml"
    path.write_text(text)
    with pytest.raises(drift.EnvironmentFileError, match="environment.yml: .*" + message.replace("(", r"\(")):
        drift.declared_packages(path)


def test_memory_follows_the_guide_rule_and_zero_partitioning():
    psi, n = 7e9, 8
    assert estimate(psi, "bf16", 0, n).total_bytes == 20 * psi  # the guide's 20 bytes per parameter
    assert estimate(psi, "fp16", 1, n).total_bytes == pytest.approx(4 * psi + 16 * psi / n)
    assert estimate(psi, "fp16", 2, n).total_bytes == pytest.approx(2 * psi + 18 * psi / n)
    assert estimate(psi, "fp16", 3, n).total_bytes == pytest.approx(20 * psi / n)
    assert estimate(psi, "fp32", 0, 1).total_bytes == 16 * psi
    assert estimate(psi, "bf16", 3, 1).total_bytes == estimate(psi, "bf16", 0, 1).total_bytes, "one GPU: no partition"
    assert "2 Ψ + 18 Ψ / 8 = 4.25 bytes" in estimate(psi, "bf16", 2, n).formula()


def test_the_lowest_stage_that_fits_is_recommended():
    # 7B on 8 x 80 GiB: stage 0 needs 130 GiB, stage 1 39 GiB <= 70% of 80 GiB
    assert recommend_stage(7e9, 80, 8).stage == 1
    assert recommend_stage(7e9, 40, 8).stage == 2  # stage 1's 39 GiB is over 28 GiB; stage 2's 27.7 GiB fits
    assert recommend_stage(1e8, 80, 8).stage == 0
    advice = recommend_stage(175e9, 80, 8)
    assert advice.stage is None and "ZeRO-3 needs at least 59 GPUs" in advice.summary()


@pytest.mark.parametrize("call, message", [
    (lambda: estimate(0), "params: 0 is not allowed"),
    (lambda: estimate(1e9, precision="int4"), "precision: 'int4' is not allowed; allowed: fp16, bf16, fp32"),
    (lambda: estimate(1e9, zero_stage=4), "zero_stage: 4 is not allowed; allowed: 0, 1, 2 or 3"),
    (lambda: estimate(1e9, gpus=0), "gpus: 0 is not allowed; allowed: 1 or more"),
    (lambda: recommend_stage(1e9, -1, 8), "gpu_memory_gib: -1 is not allowed"),
    (lambda: parse_count("seven"), "params: 'seven' is not allowed"),
    (lambda: parse_count("-3B"), "params: '-3B' is not allowed"),
])
def test_bad_estimator_input(call, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        call()


def test_parameter_counts_from_text_and_from_a_config():
    assert [parse_count(t) for t in ("350M", "7B", "1.3e9", "70b", "1_000")] == [350e6, 7e9, 1.3e9, 70e9, 1000]
    from toolkit import config
    from toolkit.train.models import MODELS

    cfg = config.load("demo")
    assert model_params(cfg) == sum(p.numel() for p in MODELS["gpt"].build(cfg.model).parameters())
    proc = cli("estimate", "--config", "demo", "--gpus", "1")
    assert proc.returncode == 0 and "ZeRO-0" in proc.stdout and "<- recommended" in proc.stdout
    assert cli("estimate", "12 parsecs").returncode == 2


def test_the_doctor_names_an_nccl_setting_that_would_break_collectives(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=no-such-nic0")
    monkeypatch.setenv("NCCL_ASYNC_ERROR_HANDLING", "1")
    proc = cli("doctor", "--only", "nccl-env", "--workspace", str(tmp_path / "ws"), "--json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr  # not a required check: a CPU machine trains without NCCL
    line = next(x for x in proc.stdout.splitlines() if x.startswith("nccl-env"))
    assert "FAIL" in line and "NCCL_SOCKET_IFNAME==no-such-nic0 matches no network interface here" in line
    report = json.loads((tmp_path / "r.json").read_text())
    (check,) = report["checks"]
    assert check["details"]["settings"] == {"NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_SOCKET_IFNAME": "=no-such-nic0"}
    assert [f["level"] for f in check["details"]["findings"]] == ["fail", "warn"]
