"""Checkpoints and recovery, for real: SIGKILLed runs, corrupted files, full disks, exact resume."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
import torch
import yaml
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from toolkit.checkpoint import sharded
from toolkit.runs import launch
from toolkit.checkpoint.interval_advisor import advise_for_run
from toolkit.checkpoint.store import CheckpointStore, step_name
from toolkit.events import CheckpointEvent, TrainEvent
from toolkit.rundir import RunDir

from conftest import cli

EVERY = 10
STEPS = 40
CKPT = ["--set", f"checkpoint.every_steps={EVERY}", "--set", "train.log_every=1", "--set", "train.eval_every=20"]


def losses_by_step(run: RunDir) -> dict[int, float]:
    """The loss of every step; where a step ran twice (before a kill and after the resume), the later one."""
    return {e["step"]: e["loss"] for e in run.events("train")}


def assert_log_matches(resumed: RunDir, reference: RunDir) -> None:
    got, want = losses_by_step(resumed), losses_by_step(reference)
    assert sorted(got) == list(range(1, STEPS + 1)) == sorted(want)
    mismatched = [(s, got[s], want[s]) for s in want if got[s] != want[s]]
    assert not mismatched, f"losses differ after resume (step, resumed, uninterrupted): {mismatched[:5]}"


@pytest.fixture
def reference_runs(finished_runs):
    """Uninterrupted runs, one per engine/world size, trained once and shared by the golden tests."""
    return lambda flags: finished_runs(*CKPT, *flags)


# The engines and world sizes of the golden tests; test_training compares the engines on these same reference runs.
TORCH_1, TORCH_DDP_2 = (), ("--nproc", "2")
TORCH_TP_2 = ("--nproc", "2", "--set", "engine.tensor_parallel=2")  # one replica split over two ranks
DEEPSPEED_1, DEEPSPEED_ZERO2_2 = ("--engine", "deepspeed"), ("--engine", "deepspeed", "--nproc", "2", "--set",
                                                             "engine.zero_stage=2")
# ZeRO-3 over two ranks, with 3 validation batches: rank 1's share is one short, and ZeRO-3 gathers weights inside
# forward, so it must join rank 0's last forward (test_training). Not a golden layout: the uninterrupted run is shared
# by activation checkpointing's comparison, export's consolidation and that evaluation test.
DEEPSPEED_ZERO3_2 = ("--engine", "deepspeed", "--nproc", "2", "--set", "engine.zero_stage=3", "--set",
                     "train.eval_batches=3")
# 4 micro-batches of 2 per optimizer step: the same 8 rows a step as tiny's batch of 8, in a quarter of the memory
ACCUM = ("--set", "train.batch_size=2", "--set", "train.grad_accum_steps=4")
# one replica in two pipeline stages (a block each), its 4 micro-batches a step in the 1F1B schedule
TORCH_PP_2 = ("--nproc", "2", "--set", "engine.pipeline_parallel=2", *ACCUM)
# FSDP2 over two ranks, each step's 8 rows as 4 micro-batches of 2: sharded state, gradients reduced once a step
FSDP_2_ACCUM = ("--engine", "fsdp", "--nproc", "2", *ACCUM)
# torch.compile in place: the same checkpoints, an exact resume. On one thread: Inductor's CPU kernels reduce across
# threads in a varying order, so on two any two compiled runs differ in the last bits (pytorch/pytorch#94855)
COMPILED = ("--set", "train.compile=true", "--set", "train.threads=1")
# The rows that add accumulation to a layout are the matrix's (`make test-matrix`, docs/CONTRIBUTING.md): accumulation
# and resume each run their own code, proven in `make test` (test_training's comparison of the same runs, the other rows)
GOLDEN = [
    pytest.param(TORCH_1, id="torch-1", marks=pytest.mark.smoke),
    pytest.param(TORCH_1 + COMPILED, id="torch-1-compiled"),
    pytest.param(DEEPSPEED_1 + COMPILED, id="deepspeed-1-compiled", marks=pytest.mark.slow),
    pytest.param(TORCH_1 + ACCUM, id="torch-1-accum", marks=[pytest.mark.slow, pytest.mark.matrix]),
    pytest.param(DEEPSPEED_ZERO2_2 + ACCUM, id="deepspeed-zero2-2-accum", marks=[pytest.mark.slow, pytest.mark.matrix]),
    pytest.param(TORCH_DDP_2, id="torch-ddp-2", marks=pytest.mark.slow),
    pytest.param(TORCH_TP_2, id="torch-tp-2", marks=pytest.mark.slow),
    pytest.param(TORCH_PP_2, id="torch-pp-2-accum", marks=pytest.mark.slow),
    pytest.param(DEEPSPEED_1, id="deepspeed-1", marks=pytest.mark.slow),
    pytest.param(DEEPSPEED_ZERO2_2, id="deepspeed-zero2-2", marks=pytest.mark.slow),
    pytest.param(FSDP_2_ACCUM, id="fsdp-2-accum", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("flags", GOLDEN)
def test_golden_losses_after_sigkill_and_automatic_restart(tmp_path, reference_runs, flags, rng):
    kill_at = rng.randint(EVERY + 1, STEPS - 1)  # a random step, past the first checkpoint
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *CKPT, *flags,
               "--set", f"fault.kill_at_step={kill_at}", "--max-restarts", "1")
    assert proc.returncode == 0, f"kill at {kill_at}: {proc.stderr[-3000:]}"
    run = RunDir(tmp_path / "r")
    (restart,) = run.events("restart")
    assert restart["reason"] in ("signal SIGKILL", "exit code 1"), restart  # torchrun reports its ranks' deaths
    assert restart["from_step"] in (kill_at // EVERY * EVERY, kill_at // EVERY * EVERY - EVERY)
    status = run.read_status()
    assert status["state"] == "completed" and status["restarts"] == 1, status
    assert_log_matches(run, reference_runs(flags))


@pytest.mark.slow
def test_fsdp_trains_as_ddp_does_and_each_rank_writes_only_its_own_shards(reference_runs, tmp_path):
    """FSDP2 and DDP compute the same steps (DDP's batch of 8 a rank, FSDP's as 4 micro-batches of 2), so their fp32
    losses agree to float rounding; FSDP's checkpoints hold no whole state, only each rank's shards, and an export
    assembles the weights from them."""
    fsdp, ddp = reference_runs(FSDP_2_ACCUM), reference_runs(TORCH_DDP_2)
    assert [e["loss"] for e in fsdp.events("train")] == pytest.approx([e["loss"] for e in ddp.events("train")],
                                                                      rel=1e-5)
    latest, whole = CheckpointStore(fsdp.path).list()[-1], CheckpointStore(ddp.path).list()[-1]
    assert latest.valid and latest.manifest["engine"] == "fsdp", latest
    files = latest.manifest["files"]
    assert not {"model.pt", "optimizer.pt"} & set(files), sorted(files)
    assert {"model.pt", "optimizer.pt"} <= set(whole.manifest["files"])
    # what each rank's shard holds, from its own metadata: half of every parameter and moment (each tensor's rows
    # split in two), and the few scalars every rank keeps whole (each moment's step count)
    held = []
    for rank in (0, 1):
        metadata = sharded.read_metadata(latest.path / f"shards/rank_{rank:05d}/.metadata")
        tensors = [e for e in metadata.state_dict_metadata.values() if isinstance(e, TensorStorageMetadata)]
        held.append(sum(torch.Size(c.sizes).numel() for e in tensors for c in e.chunks))
        total = sum(torch.Size(e.size).numel() for e in tensors)
    assert all(0.45 * total < n < 0.55 * total for n in held), (held, total)
    exported = cli("export", str(fsdp.path), "--out", str(tmp_path / "model"))
    assert exported.returncode == 0 and f"({latest.name}, fsdp)" in exported.stdout, exported.stdout + exported.stderr


@pytest.mark.slow
@pytest.mark.parametrize("flags, engine", [(TORCH_DDP_2, "fsdp"), (FSDP_2_ACCUM, "torch")],
                         ids=["ddp-to-fsdp", "fsdp-to-ddp"])
def test_ddp_and_fsdp_resume_each_others_checkpoints_with_the_same_losses(finished_run_copy, reference_runs, flags,
                                                                          engine):
    """The layout may change at a resume where the computation does not: DDP's whole tensors resharded by FSDP,
    FSDP's shards assembled whole on each DDP replica. Steps 21-40 then match the run that never changed (to float
    rounding: the two engines sum in another order)."""
    run = finished_run_copy(*CKPT, *flags)
    CheckpointStore(run.path).roll_back_to(step_name(20))
    run.write_status(state="failed")
    resumed = cli("resume", str(run.path), "--set", f"engine.name={engine}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [e for e in run.events("status") if e.get("resumed_from")][-1]["resumed_from"] == step_name(20)
    got, want = losses_by_step(run), losses_by_step(reference_runs(flags))
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    assert [got[s] for s in range(21, STEPS + 1)] == pytest.approx([want[s] for s in range(21, STEPS + 1)], rel=1e-5)
    assert run.read_config().engine.name == engine


def test_external_sigkill_then_resume_command(tmp_path, reference_runs, rng):
    # a tiny step takes ~7 ms; sleeping 20 ms in each step after the first checkpoint leaves the follower
    # (which reads every 50 ms) time to kill before the end. Sleeps change no loss.
    handle = launch.train("tiny", ["checkpoint.every_steps=10", "train.log_every=1", "train.eval_every=20",
                                   "train.max_steps=40", f"fault.slow_steps_after_checkpoint={EVERY}",
                                   "fault.slow_step_ms=20"], run_dir=tmp_path / "r")
    target = rng.randint(EVERY + 2, STEPS - 8)
    published = False  # checkpoints are written in the background: a kill before the event loses that one
    for event in handle.follow(interval_s=0.05):
        published = published or isinstance(event, CheckpointEvent)
        if published and isinstance(event, TrainEvent) and event.step >= target:
            assert handle.kill(), "no training process to kill"
            break
    assert handle.wait(60) != 0
    status = handle.run.read_status()
    assert status["state"] == "killed" and status["error"] == "signal SIGKILL", status

    listing = cli("checkpoints", str(handle.path))
    assert listing.returncode == 0 and "valid" in listing.stdout and "LATEST" in listing.stdout, listing.stdout
    proc = cli("resume", str(handle.path))
    assert proc.returncode == 0, proc.stderr
    assert "completed: step 40" in proc.stderr
    resumed = handle.run.events("status")
    assert any(e.get("resumed_from") for e in resumed), resumed
    assert_log_matches(handle.run, reference_runs(()))


@pytest.mark.slow
def test_supervisor_survives_two_kills_and_finishes(tmp_path):
    handle = launch.train("tiny", ["checkpoint.every_steps=10", "train.log_every=1", "train.max_steps=60",
                                   "fault.kill_at_step=15"], run_dir=tmp_path / "r", max_restarts=2)
    for event in handle.follow(interval_s=0.1):
        # the fault kills attempt 0 at step 15; kill attempt 1 ourselves once it has trained past step 25
        if isinstance(event, TrainEvent) and event.step >= 25 and handle.run.read_status().get("attempt") == 1:
            assert handle.kill()
            break
    assert handle.wait(300) == 0, (handle.path / launch.LOG_NAME).read_text()[-3000:]
    restarts = handle.run.events("restart")
    assert [r["restart"] for r in restarts] == [1, 2]
    status = handle.run.read_status()
    assert status["state"] == "completed" and status["restarts"] == 2 and status["step"] == 60


def _finished_run(tmp_path, extra, name="src") -> RunDir:
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / name), *CKPT, *extra)
    assert proc.returncode == 0, proc.stderr
    return RunDir(tmp_path / name)


def _copy_with_config(run: RunDir, dest: Path, **changes) -> RunDir:
    """A run directory holding ``run``'s checkpoints but a config changed as given (section.field=value)."""
    shutil.copytree(run.path, dest)
    cfg = yaml.safe_load((dest / "config.yaml").read_text())
    for key, value in changes.items():
        section, field = key.split("__")
        cfg[section][field] = value
    (dest / "config.yaml").write_text(yaml.safe_dump(cfg))
    copy = RunDir(dest)
    copy.write_status(state="failed")
    return copy


def test_checkpoints_from_another_config_or_world_size_are_refused(tmp_path, finished_run_copy):
    src = finished_run_copy(*CKPT, name="src")
    other = _copy_with_config(src, tmp_path / "wider", model__n_embd=64)
    proc = cli("resume", str(other.path))
    assert proc.returncode == 1
    error = other.read_status()["error"]
    assert "different config" in error and "model.n_embd: checkpoint 32, this run 64" in error, error

    bigger = _copy_with_config(src, tmp_path / "two", engine__nproc=2)
    proc = cli("resume", str(bigger.path))
    assert proc.returncode == 1
    error = bigger.read_status()["error"]
    assert "written by 1 processes; this run has 2" in error, error

    # what may change between attempts (the step budget, retention) is accepted: the run just goes on, keeping as
    # many checkpoints as its config now says
    longer = _copy_with_config(src, tmp_path / "longer", train__max_steps=50, checkpoint__keep_last=2)
    proc = cli("resume", str(longer.path))
    assert proc.returncode == 0, proc.stderr
    assert longer.read_status()["step"] == 50
    assert [c.step for c in CheckpointStore(longer.path).list()] == [40, 50]


def test_corrupted_truncated_and_dangling_checkpoints_fall_back_to_a_valid_one(finished_run_copy):
    src = finished_run_copy(*CKPT, name="src")
    store = CheckpointStore(src.path)
    assert [c.step for c in store.list()] == [20, 30, 40]  # retention's default: the newest three

    # flip one byte of the newest checkpoint's weights: its checksum no longer matches
    model = store.root / step_name(40) / "model.pt"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    # truncate the one before
    optimizer = store.root / step_name(30) / "optimizer.pt"
    optimizer.write_bytes(optimizer.read_bytes()[:100])

    listing = cli("checkpoints", str(src.path)).stdout
    assert "step_00000040" in listing and "fails its xxh3_128 check" in listing, listing
    assert "truncated" in listing, listing
    info, skipped = store.find_resume_point()
    assert info.name == step_name(20) and [s.name for s in skipped] == [step_name(40), step_name(30)]

    # LATEST naming a folder that does not exist
    (store.root / "LATEST").write_text("step_99999999\n")
    info, skipped = store.find_resume_point()
    assert info.name == step_name(20) and skipped[0].reason == "folder does not exist"

    src.write_status(state="failed")
    proc = cli("resume", str(src.path), "--max-restarts", "0")
    assert proc.returncode == 0, proc.stderr
    invalid = {e["checkpoint"]: e["reason"] for e in src.events("checkpoint_invalid")}
    assert set(invalid) >= {"step_99999999", step_name(30)}, invalid
    starts = [e for e in src.events("status") if e.get("resumed_from")]
    assert starts[-1]["resumed_from"] == step_name(20)
    assert CheckpointStore(src.path).find_resume_point()[0].step == 40  # rewritten, valid again


def test_a_kill_during_the_background_write_leaves_the_previous_checkpoint(tmp_path, reference_runs):
    # Kill right after checkpoint 30 is handed to the writer thread: its write is cut off mid-way.
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *CKPT, "--set", "fault.kill_at_step=30",
               "--max-restarts", "1")
    assert proc.returncode == 0, proc.stderr
    run = RunDir(tmp_path / "r")
    (restart,) = run.events("restart")
    assert restart["from_step"] in (20, 30)
    assert not list((run.path / "checkpoints").glob(".tmp-*")), "partial checkpoint folders were not cleaned up"
    assert_log_matches(run, reference_runs(()))


def test_partial_folders_are_listed_as_invalid_and_removed_on_resume(finished_run_copy):
    src = finished_run_copy(*CKPT, name="src")
    partial = CheckpointStore(src.path).tmp_folder(50)
    partial.mkdir()
    (partial / "model.pt").write_bytes(b"half a checkpoint")
    assert "partial write (never published)" in cli("checkpoints", str(src.path)).stdout
    src.write_status(state="failed")
    assert cli("resume", str(src.path)).returncode == 0
    assert not partial.exists()


def test_full_disk_reports_the_failed_save_and_training_goes_on(small_mount):
    # 700 kB hold the run's logs and one 0.48 MB checkpoint, not two
    with small_mount("-t", "tmpfs", "-o", "size=700k", "tmpfs") as mount:
        proc = cli("train", "tiny", "--run-dir", str(mount / "r"), *CKPT, "--set", "checkpoint.keep_last=1",
                   "--set", "train.log_every=10")
        run = RunDir(mount / "r")
        assert proc.returncode == 0, proc.stderr
        assert run.read_status()["state"] == "completed" and run.read_status()["step"] == STEPS
        errors = run.events("checkpoint_error")
        assert errors and all("No space left on device" in e["message"] for e in errors), errors
        info, _ = CheckpointStore(run.path).find_resume_point()
        assert info is not None and info.valid, "the checkpoint that fitted must still be valid"
        assert not list((run.path / "checkpoints").glob(".tmp-*"))


def test_retention_keeps_the_newest_and_never_the_one_latest_names(finished_run_copy):
    run = finished_run_copy(*CKPT, name="r")
    store = CheckpointStore(run.path)
    assert run.read_config().checkpoint.keep_last == 3
    assert [c.name for c in store.list()] == [step_name(20), step_name(30), step_name(40)]
    assert store.latest_name() == step_name(40)
    (store.root / "LATEST").write_text(step_name(30) + "\n")  # an older checkpoint named by LATEST survives
    assert store.apply_retention(1) == [step_name(20)] and store.latest_name() == step_name(30)
    assert [c.name for c in store.list()] == [step_name(30), step_name(40)]
    manifest = json.loads((store.root / step_name(40) / "manifest.json").read_text())
    assert manifest["step"] == 40 and manifest["world_size"] == 1 and "model.pt" in manifest["files"]
    assert all(len(f["xxh3_128"]) == 32 for f in manifest["files"].values())


def test_checkpoint_events_report_lost_blocking_persist_and_bytes(finished_runs):
    run = finished_runs(*CKPT)  # read only
    events = run.events("checkpoint")
    assert [e["step"] for e in events] == [10, 20, 30, 40]
    for e in events:
        assert 0 < e["blocking_ms"] < e["persist_ms"] and e["bytes"] > 100_000, e
        assert e["lost_ms"] >= e["blocking_ms"] and e["window_steps"] >= 1, e


def test_a_checkpoint_that_waits_for_the_previous_write_says_so(tmp_path):
    """Every 2 steps, on a disk where a write takes 600 ms more: each checkpoint after the first waits for the one
    before (one is written at a time), its event says how long (waited_ms, part of blocking_ms), and the run says
    once, on stderr, that checkpoints come faster than they are written."""
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *CKPT, *[f"--set={s}" for s in (
        "train.max_steps=6", "checkpoint.every_steps=2", "checkpoint.at_end=false", "fault.slow_write_ms=600")])
    assert proc.returncode == 0, proc.stderr
    events = RunDir(tmp_path / "r").events("checkpoint")
    assert [e["step"] for e in events] == [2, 4], events  # step 6's window never closes: training ended
    assert events[0]["waited_ms"] == 0, events
    assert 300 < events[1]["waited_ms"] <= events[1]["blocking_ms"], events
    assert proc.stderr.count("checkpoints come faster than they are written") == 1, proc.stderr
    assert "trainbook advise" in proc.stderr


def test_lost_time_reports_the_slowdown_injected_after_each_checkpoint(tmp_path):
    """3 steps after each checkpoint sleep 400 ms: each checkpoint must report ~1.2 s lost, though it blocked
    for a few ms; and the advisor must take that loss as the checkpoint's cost."""
    run = _finished_run(tmp_path, extra=[f"--set={s}" for s in (
        "train.max_steps=60", "checkpoint.every_steps=20", "checkpoint.at_end=false",
        "fault.slow_steps_after_checkpoint=3", "fault.slow_step_ms=400")])
    events = run.events("checkpoint")
    assert [e["step"] for e in events] == [20, 40], events
    for e in events:
        assert 1200 * 0.85 < e["lost_ms"] < 1200 * 1.5, e  # blocking alone is a few ms; a missed step -400
        assert e["blocking_ms"] < 100 and e["baseline_step_ms"] > 0 and e["window_steps"] >= 4, e
    advice = advise_for_run(run.path, mtbf_s=3600.0)
    assert advice.cost_basis == "lost"
    assert advice.cost_s == pytest.approx(statistics.median(e["lost_ms"] for e in events) / 1e3)
    assert "training time lost" in advice.summary()


def test_advise_command_reads_a_run(finished_runs):
    run = finished_runs(*CKPT)  # read only
    proc = cli("advise", str(run.path), "--mtbf-hours", "4")
    assert proc.returncode == 0, proc.stderr
    assert "checkpoint every" in proc.stdout and "T = sqrt(2 C M) - C" in proc.stdout
    proc = cli("advise", str(run.path), "--mtbf-hours", "-1")
    assert proc.returncode == 2 and "--mtbf-hours: -1.0 is not allowed" in proc.stderr


def test_resume_from_an_older_checkpoint_rolls_back_and_replays_the_same_losses(reference_runs, finished_run_copy):
    reference = reference_runs(())
    run_dir = finished_run_copy(*CKPT, name="r").path  # a finished run (retention kept 20, 30, 40), rolled back to 20
    bad = cli("resume", str(run_dir), "--from", "step_99999999")
    assert bad.returncode == 2 and "checkpoint: 'step_99999999' is not a published checkpoint" in bad.stderr
    assert "allowed: step_00000020, step_00000030, step_00000040" in bad.stderr, bad.stderr
    assert CheckpointStore(run_dir).latest_name() == step_name(STEPS), "a refused roll-back changes nothing"

    proc = cli("resume", str(run_dir), "--from", step_name(2 * EVERY))
    assert proc.returncode == 0, proc.stderr
    run = RunDir(run_dir)
    assert [e["step"] for e in run.events("train")].count(2 * EVERY + 1) == 2, "steps 21.. ran again"
    # the replayed steps 11..40 overwrite the first attempt's in losses_by_step: they must be the same numbers
    assert_log_matches(run, reference)
    names = [i.name for i in CheckpointStore(run_dir).list()]
    superseded = [n for n in names if n.startswith("superseded-")]
    assert len(superseded) == 2, names  # steps 30 and 40 of the first attempt: set aside, never deleted
    assert CheckpointStore(run_dir).latest_name() == step_name(STEPS)


def test_resume_set_gives_a_completed_run_more_steps(finished_run_copy):
    run = finished_run_copy(*CKPT, name="r")
    before = losses_by_step(run)
    unchanged = cli("resume", str(run.path), "--set", f"train.max_steps={STEPS}")
    assert unchanged.returncode == 0 and "nothing to resume, nothing changed" in unchanged.stderr, unchanged.stderr
    proc = cli("resume", str(run.path), "--set", "train.max_steps=50")
    assert proc.returncode == 0, proc.stderr
    assert f"resuming from {step_name(STEPS)}" in proc.stderr
    assert run.read_status()["step"] == 50 and run.read_config().train.max_steps == 50
    after = losses_by_step(run)
    assert sorted(after) == list(range(1, 51)) and all(after[s] == before[s] for s in before)
