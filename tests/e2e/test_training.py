"""Real training runs through the CLI and the launcher: the run directory contract, both engines, 1 and 2 processes."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import TEN_STEPS
from test_checkpoint import (ACCUM, DEEPSPEED_1, DEEPSPEED_ZERO2_2, DEEPSPEED_ZERO3_2, STEPS, TORCH_1,  # noqa: F401
                             TORCH_DDP_2, reference_runs)
from toolkit import config as config_mod
from toolkit.runs import launch
from toolkit.report.tables import top_operators_html
from toolkit.events import TrainEvent
from toolkit.rundir import RunDir

TRAIN_FIELDS = {"step", "loss", "lr", "tokens_per_s", "data_wait_pct", "mfu"}


def assert_run_contract(run: RunDir, steps: int) -> list[dict]:
    """The files DESIGN.md promises, with the fields every reader relies on. Returns the train events."""
    for name in ("config.yaml", "status.json", "events.jsonl", "lineage.json"):
        assert (run.path / name).is_file(), f"{name} missing from {run.path}"
    assert run.read_config() == config_mod.from_dict(run.read_config().to_dict())
    status = run.read_status()
    assert status["state"] == "completed" and status["step"] == steps, status
    train = run.events("train")
    assert train and all(TRAIN_FIELDS <= set(e) for e in train), train[:1]
    assert train[-1]["step"] == steps
    assert all(e["tokens_per_s"] > 0 and 0 < e["mfu"] < 1 and 0 <= e["data_wait_pct"] < 100 for e in train)
    evals = run.events("eval")
    assert evals and all({"val_loss", "val_bpb"} <= set(e) for e in evals)
    assert math.isclose(evals[-1]["val_bpb"], evals[-1]["val_loss"] / math.log(2), rel_tol=1e-4)
    lineage = json.loads(run.lineage_path.read_text())
    assert lineage["data"]["name"] == "pydoc" and len(lineage["data"]["sha256"]) == 64
    assert lineage["packages"]["torch"].startswith("2.13.0")
    assert lineage["config_sha256"] == run.read_config().fingerprint()
    return train


@pytest.mark.smoke
def test_tiny_run_learns_and_fills_the_run_directory(train_tiny):
    proc, run = train_tiny("--set", "train.log_every=2", "--set", "profile.enabled=true",
                           "--set", "profile.wait=1", "--set", "profile.warmup=1", "--set", "profile.active=2")
    assert proc.returncode == 0, proc.stderr
    assert "completed: step 40" in proc.stderr and "tok_s=" in proc.stderr  # the progress bar and summary
    train = assert_run_contract(run, steps=40)
    first, last = train[0]["loss"], train[-1]["loss"]
    assert last < first - 1.0, f"loss did not go down: {first} -> {last}"
    assert math.isclose(first, math.log(256), rel_tol=0.1), "a fresh byte model should start near ln(256)"
    # warmup then cosine: lr rises for 5 steps, then falls
    lrs = [e["lr"] for e in train]
    assert lrs[1] > lrs[0] and lrs[-1] < max(lrs)
    # the final status says how much memory training took: at least the weights, far less than the machine
    completed = run.events("status")[-1]
    assert completed["state"] == "completed" and 50 < completed["peak_memory_mb"] < 16 * 1024, completed
    # bytes: one byte per token, said from the start, so a live loss plot is in bits per byte from its first point
    assert run.events("status")[0]["bytes_per_token"] == 1.0

    # TensorBoard scalars, read back with TensorBoard's own reader
    acc = EventAccumulator(str(run.tb_dir))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "perf/tokens_per_s", "perf/mfu", "perf/data_wait_pct",
            "eval/val_loss", "eval/val_bpb"} <= tags
    assert [s.step for s in acc.Scalars("train/loss")] == [e["step"] for e in train]

    # profiler: traces for the TensorBoard plugin and a readable summary
    assert list(run.profile_dir.glob("*.pt.trace.json")), list(run.profile_dir.iterdir())
    summary = (run.profile_dir / "summary.txt").read_text()
    assert "Self CPU" in summary and "aten::" in summary
    (profile_event,) = run.events("profile")
    assert profile_event["top_ops"] and profile_event["top_ops"][0]["self_cpu_ms"] > 0
    table = top_operators_html(run.path)  # what notebook 03 shows
    assert table.count("<tr>") > 5 and "aten::" in table


def test_same_seed_same_losses(train_tiny, finished_runs):
    """The run is a pure function of its config: two runs log identical losses, step for step; an evaluation
    before the first step (train.eval_at_start, a fine-tune's baseline) is logged at step 0 and changes none."""
    proc, again = train_tiny(*TEN_STEPS, "--set", "train.eval_at_start=true")
    assert proc.returncode == 0, proc.stderr
    runs = [finished_runs(*TEN_STEPS), again]  # the first trained once a session, in another process
    losses = [[e["loss"] for e in r.events("train")] for r in runs]
    assert len(losses[0]) == 10 and losses[0] == losses[1]
    assert [e["step"] for e in runs[0].events("eval")] == [10]
    assert [e["step"] for e in runs[1].events("eval")] == [0, 10]


def test_time_budget_stops_the_run_and_finishes_the_schedule(train_tiny):
    proc, run = train_tiny("--set", "train.max_steps=1000000", "--set", "train.max_seconds=3",
                           "--set", "train.log_every=5", "--set", "train.eval_every=1000000")
    assert proc.returncode == 0, proc.stderr
    train = run.events("train")
    last = train[-1]
    assert 3 <= last["elapsed_s"] < 10 and last["step"] < 1000000
    assert run.read_status()["state"] == "completed"
    assert run.events("eval")[-1]["step"] == last["step"], "a stopped run still gets its final evaluation"
    cfg = run.read_config()
    # the cosine horizon followed the clock: by the end the LR has decayed most of the way to min_lr
    assert last["lr"] < cfg.optim.min_lr + 0.25 * (cfg.optim.lr - cfg.optim.min_lr), last


def test_a_step_floor_outlasts_a_spent_time_budget(train_tiny):
    """train.min_steps: a machine too slow for the budget trains on to the floor, and its schedule ends there."""
    proc, run = train_tiny("--set", "train.max_steps=1000", "--set", "train.max_seconds=0.001",
                           "--set", "train.min_steps=15", "--set", "train.log_every=1", "--set", "train.eval_every=1000")
    assert proc.returncode == 0, proc.stderr
    train = run.events("train")
    assert train[-1]["step"] == 15 and run.read_status()["state"] == "completed", train[-1]
    assert [e["horizon"] for e in train[1:]] == [15] * (len(train) - 1), "the schedule ends at the floor"
    cfg = run.read_config()
    assert train[-1]["lr"] < cfg.optim.min_lr + 0.05 * (cfg.optim.lr - cfg.optim.min_lr), train[-1]


def test_digits_classifier_through_the_same_loop(train_tiny):
    proc, run = train_tiny("--set", "model.name=digits_mlp", "--set", "data.dataset=digits",
                           "--set", "model.n_embd=64", "--set", "train.batch_size=64", "--set", "train.max_steps=60",
                           "--set", "optim.lr=0.01", "--set", "optim.min_lr=0.001")
    assert proc.returncode == 0, proc.stderr
    evals = run.events("eval")
    assert "val_bpb" not in evals[-1], "bits per byte only means something for byte-level text"
    assert evals[-1]["val_loss"] < 0.5 * math.log(10), evals  # well below chance (ln 10 nats)


def test_a_failing_run_says_why_and_exits_nonzero(train_tiny):
    # A context longer than the validation split fails inside the worker, after the run directory exists.
    proc, run = train_tiny("--set", "model.block_size=8192", "--set", "data.val_fraction=0.01")
    assert proc.returncode == 1
    assert "training failed" in proc.stderr
    status = run.read_status()
    assert status["state"] == "failed" and "model.block_size: 8192 is too long" in status["error"]
    (error,) = run.events("error")
    assert "model.block_size" in error["message"]
    assert "Traceback" in (run.path / launch.LOG_NAME).read_text()


def test_stopping_a_run_marks_it_stopped_not_killed(tmp_path):
    handle = launch.train("tiny", ["train.max_steps=100000", "train.log_every=1"], run_dir=tmp_path / "k")
    for event in handle.follow(interval_s=0.2):  # wait until training is really under way
        if isinstance(event, TrainEvent):
            break
    assert handle.stop() == 0  # asked to stop, the training ends well: after a checkpoint of the step it was in
    pgid = handle.run.read_status()["worker_pgid"]
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)  # no training process outlives the stop
    status = handle.run.read_status()
    assert status["state"] == "stopped" and not status.get("error"), status
    assert handle.run.events("status")[-1]["state"] == "stopped"
    from toolkit.checkpoint.store import CheckpointStore

    latest = CheckpointStore(handle.path).list()[-1]
    assert latest.valid and latest.step == status["step"], (latest, status)


def test_killing_the_training_processes_marks_the_run_killed(tmp_path):
    handle = launch.train("tiny", ["train.max_steps=100000", "train.log_every=1"], run_dir=tmp_path / "k")
    for event in handle.follow(interval_s=0.2):
        if isinstance(event, TrainEvent):
            break
    assert handle.kill()
    assert handle.wait(30) != 0
    status = handle.run.read_status()
    assert status["state"] == "killed" and status["error"] == "signal SIGKILL"
    assert handle.run.events("status")[-1]["state"] == "killed"


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    TORCH_DDP_2,  # DDP through torchrun
    DEEPSPEED_1,
    ("--engine", "deepspeed", "--nproc", "2", "--set", "engine.zero_stage=3", "--set", "engine.precision=bf16"),
    ("--engine", "deepspeed", "--nproc", "2", "--set", "engine.zero_stage=1", "--set", "engine.launcher=torchrun"),
], ids=["torch-ddp-2", "deepspeed-1", "deepspeed-zero3-bf16-2-dslauncher", "deepspeed-zero1-2-torchrun"])
def test_engines_and_process_counts(reference_runs, flags):
    run = reference_runs(flags)  # the first two: the golden tests' uninterrupted runs, trained once for both
    train = assert_run_contract(run, steps=40)
    assert train[-1]["loss"] < train[0]["loss"] - 1.0
    nproc = run.read_config().engine.nproc
    assert json.loads(run.lineage_path.read_text())["world_size"] == nproc
    # DeepSpeed's CPU allreduce maps a 66 MB /dev/shm buffer per rank and never unlinks it: a run must not leave
    # them behind (a day of runs filled 18 GB of RAM-backed /dev/shm here)
    port = next((a.split("=")[1] for a in run.read_status()["command"] if a.startswith("--master_port=")), None)
    if port is not None:
        assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))


@pytest.mark.slow
@pytest.mark.parametrize("torch_flags, deepspeed_flags", [(TORCH_1, DEEPSPEED_1), (TORCH_DDP_2, DEEPSPEED_ZERO2_2)],
                         ids=["1-0", "2-2"])
def test_deepspeed_matches_torch_step_for_step(reference_runs, torch_flags, deepspeed_flags):
    """Same model, data, seed and optimizer: the engines differ only in mechanics, so fp32 losses agree. Compared on
    the golden tests' uninterrupted runs (40 steps, a loss per step, checkpoints and an evaluation between)."""
    torch_losses = [e["loss"] for e in reference_runs(torch_flags).events("train")]
    ds_losses = [e["loss"] for e in reference_runs(deepspeed_flags).events("train")]
    assert len(torch_losses) == len(ds_losses) == STEPS
    assert ds_losses == pytest.approx(torch_losses, rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [TORCH_1, TORCH_DDP_2, DEEPSPEED_ZERO2_2], ids=["torch-1", "torch-ddp-2",
                                                                            "deepspeed-zero2-2"])
def test_accumulated_micro_batches_train_as_one_big_batch(reference_runs, flags):
    """4 micro-batches of 2 and one batch of 8 see the same rows (a step's batch is drawn whole, then split), so the
    losses agree to float rounding (gradients summed in another order), at every step, for both engines; and the
    schedule, the logged steps and the tokens per step count optimizer steps, not micro-steps."""
    whole, accumulated = reference_runs(flags), reference_runs(flags + ACCUM)
    big, small = whole.events("train"), accumulated.events("train")
    assert [e["step"] for e in small] == [e["step"] for e in big] == list(range(1, STEPS + 1))
    assert [e["loss"] for e in small] == pytest.approx([e["loss"] for e in big], rel=1e-5)
    assert [e["lr"] for e in small] == [e["lr"] for e in big]
    assert accumulated.events("eval")[-1]["val_loss"] == pytest.approx(whole.events("eval")[-1]["val_loss"],
                                                                       rel=1e-5)
    nproc = accumulated.read_config().engine.nproc
    assert all(len(e["peak_memory_mb"]) == nproc and min(e["peak_memory_mb"]) > 50 for e in small), small[-1]
    checkpoints = [e["step"] for e in accumulated.events("checkpoint")]
    assert checkpoints == [e["step"] for e in whole.events("checkpoint")] == [10, 20, 30, 40]


@pytest.mark.slow
def test_ddp_all_reduces_once_per_optimizer_step_with_accumulation():
    """no_sync on the inner micro-steps: 4 micro-batches cost DDP the all-reduces of one step, not four (counted by a
    communication hook in a 2-process torchrun of the torch engine; bench/bench_accumulation.py reports the same)."""
    import subprocess
    import sys

    from conftest import PROJECT
    from toolkit.ports import free_port

    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), str(PROJECT / "bench" / "bench_accumulation.py"), "--count-all-reduces"],
                          capture_output=True, text=True, timeout=300, cwd=PROJECT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts["4 x 8"] == counts["1 x 32"] >= 1, counts


@pytest.mark.slow
def test_zero3_evaluates_an_odd_number_of_batches_over_two_ranks(reference_runs):
    """ZeRO-3 gathers weights inside forward, so every rank must run as many evaluation forwards as the others: with 3
    validation batches over 2 ranks, rank 1's share is one short and it joins rank 0's last forward (uncounted). This
    run used to hang in that all-gather until the collective timed out. (The shared uninterrupted ZeRO-3 run.)"""
    run = reference_runs(DEEPSPEED_ZERO3_2)
    cfg = run.read_config()
    assert (cfg.engine.zero_stage, cfg.engine.nproc, cfg.train.eval_batches) == (3, 2, 3)
    assert run.read_status()["state"] == "completed"
    assert [e["step"] for e in run.events("eval")] == [20, 40]
