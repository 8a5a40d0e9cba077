"""`trainbook forecast` as a user runs it: a forecast of a demo-shaped run from a short run measured here, then the
run itself (its training time within a quarter of the forecast); the table, JSON and picture of a cluster
forecast; bad input refused naming the flag."""

from __future__ import annotations

import json
import os

import pytest

from toolkit.events import StatusEvent, read_events
from toolkit.rundir import RunDir

from conftest import cli

DEMO = ["--set", "train.max_seconds=0", "--set", "train.min_steps=0", "--set", "profile.enabled=false",
        "--set", "train.eval_every=100000", "--set", "train.eval_batches=1", "--set", "checkpoint.at_end=false",
        "--set", "train.log_every=5"]
TOKENS_PER_STEP = 16 * 128  # the demo config's batch of 16 rows of 128 bytes


def test_a_forecast_from_a_short_measured_run_lands_within_a_quarter_of_the_run(tmp_path):
    measured = cli("train", "demo", "--run-dir", str(tmp_path / "short"), *DEMO, "--set", "train.max_steps=40")
    assert measured.returncode == 0, measured.stderr[-3000:]
    steps = 160
    proc = cli("forecast", "demo", *DEMO, "--sku", "local", "--mfu", f"run:{tmp_path / 'short'}",
               "--tokens", str(steps * TOKENS_PER_STEP), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["forecasts"]
    assert row["sku"] == "local" and "measured by run short on this machine" in row["mfu"]["source"]
    run = cli("train", "demo", "--run-dir", str(tmp_path / "long"), *DEMO, "--set", f"train.max_steps={steps}")
    assert run.returncode == 0, run.stderr[-3000:]
    (done,) = [e for e in read_events(RunDir(tmp_path / "long"), StatusEvent) if e.state == "completed"]
    assert row["wall_s"] == pytest.approx(done.train_seconds, rel=0.25), (row, done.train_seconds)


def test_a_cluster_forecast_prints_its_table_and_sources_and_draws_time_against_cost(tmp_path):
    flags = ["--params", "7B", "--layers", "32", "--width", "4096", "--seq", "4096", "--batch-per-gpu", "4",
             "--sku", "Standard_ND96isr_H100_v5", "--sku", "Standard_ND96amsr_A100_v4", "--nodes", "1,4",
             "--price", "Standard_ND96isr_H100_v5=80"]
    text = cli("forecast", *flags, "--plot", str(tmp_path / "forecast.png"))
    assert text.returncode == 0, text.stderr[-3000:]
    assert "tokens: 1.4e+11, Chinchilla's 20 tokens a parameter" in text.stdout, text.stdout
    assert "price (Standard_ND96isr_H100_v5): 80.00 USD per node-hour, given" in text.stdout
    assert (tmp_path / "forecast.png").stat().st_size > 10_000
    report = json.loads(cli("forecast", *flags, "--json").stdout)
    rows = {(r["sku"], r["nodes"]): r for r in report["forecasts"]}
    h100, a100 = rows[("Standard_ND96isr_H100_v5", 4)], rows[("Standard_ND96amsr_A100_v4", 4)]
    assert h100["days"] < a100["days"] and h100["gpus"] == 32 and h100["fits"]
    assert rows[("Standard_ND96isr_H100_v5", 1)]["days"] == pytest.approx(4 * h100["days"], rel=0.01)


@pytest.mark.parametrize("flags, problem", [
    (["--params", "7B", "--sku", "Standard_ND96isr_H100_v6"],
     "--sku: 'Standard_ND96isr_H100_v6' is not a known VM size; allowed: Standard_ND96isr_H100_v5"),
    (["--params", "7B", "--sku", "Standard_ND96asr_v4", "--tokens=-5B"], "--tokens: '-5B' is not allowed"),
    (["--params", "7B", "--sku", "Standard_ND96asr_v4", "--nodes", "2,0"], "--nodes: '0' is not allowed"),
    (["--params", "lots", "--sku", "Standard_ND96asr_v4"], "--params: 'lots' is not allowed"),
    (["--params", "7B", "--sku", "Standard_ND96asr_v4", "--mfu", "fast"], "--mfu: 'fast' is not allowed"),
    (["--params", "50T", "--sku", "Standard_NC24ads_A100_v4"], "fits none of them at any ZeRO stage"),
    (["--params", "7B", "--sku", "Standard_ND96asr_v4", "--price", "Standard_Nope=3"],
     "--price: 'Standard_Nope=3' is not allowed; allowed: SIZE=USD_PER_HOUR"),
    (["demo", "--layers", "8", "--sku", "Standard_ND96asr_v4"], "--layers: 8 is not allowed; allowed: a whole "
                                                               "number of 1 or more, with --params"),
    (["--params", "7B", "--sku", "Standard_ND96asr_v4", "--price", "Standard_ND96asr_v4"],
     "--price: 'Standard_ND96asr_v4' is not allowed"),
    (["--params", "7B", "--sku", "Standard_ND96asr_v4", "--plot", "{tmp}/out.jsonl"],
     "--plot: '{tmp}/out.jsonl' is not a picture format matplotlib writes; allowed: a path ending in .png, .svg"),
    # a report from elsewhere that never ends or never answers: refused unread
    (["demo", "--sku", "Standard_ND96asr_v4", "--mfu", "gpu-report:/dev/zero"],
     "--mfu: '/dev/zero' is a character device, not a regular file"),
    (["demo", "--sku", "Standard_ND96asr_v4", "--mfu", "gpu-report:{tmp}/fifo"],
     "--mfu: '{tmp}/fifo' is a FIFO, not a regular file"),
    (["demo", "--sku", "Standard_ND96asr_v4", "--mfu", "gpu-report:{tmp}/huge.json"], "is over 1,048,576 bytes"),
])
def test_bad_input_is_refused_naming_the_flag(tmp_path, flags, problem):
    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "huge.json", "wb") as f:  # sparse: a report grown to a gigabyte costs no disk
        f.truncate(1 << 30)
    proc = cli("forecast", *[flag.format(tmp=tmp_path) for flag in flags], timeout=60)
    assert proc.returncode == 2 and problem.format(tmp=tmp_path) in proc.stderr, proc.stderr
    assert not (tmp_path / "out.jsonl").exists()
