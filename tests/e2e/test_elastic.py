"""Elastic training (toolkit.runs.job --nnodes 1:2): a job starts with the one node it has and takes in a second
that turns up later, as low-priority capacity does. Two "nodes" on this machine, as in test_multinode: node 0 trains
alone, node 1 starts once node 0 has trained some steps, torchrun's agents meet again, and the ranks go on from the
checkpoint they wrote on the way out, at twice the world size. With data.sampling=epochs and data.record_samples the
run writes what every step of every replica trained on: each sample once, across the change."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import PROJECT
from toolkit.status import ELASTIC_ENV

from test_multinode import DATA, DEADLINE_S, wait_for
from test_untrusted_runs import ONE_CHECKPOINT
from toolkit.data.corpus import load_corpus
from toolkit.data.epochs import epoch_order, kept_samples
from toolkit.runs.local_nodes import LocalNodesJob
from toolkit.rundir import RunDir

pytestmark = pytest.mark.slow

STEPS, JOIN_AFTER = 70, 10
CONFIG = f"""
name: elastic
model: {{name: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 32}}
optim: {{lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5}}
train: {{batch_size: 8, max_steps: {STEPS}, eval_every: {STEPS}, eval_batches: 2, log_every: 1}}
checkpoint: {{every_steps: 10}}
data: {{tokenizer: bytes, sampling: epochs, record_samples: true}}
"""
# each step sleeps 120 ms, so that node 0 is still training when node 1 has started and met it: 7 s of steps left
# for node 1's start-up, on a loaded machine too (sleeps change no sample)
SLOW = ("--set", f"fault.slow_steps_after_checkpoint={STEPS}", "--set", "fault.slow_step_ms=120")


def elastic_job(root, run_dir, *flags: str, start: int = 1) -> LocalNodesJob:
    (root / "config.yaml").write_text(CONFIG)
    data = root / "data"
    data.mkdir(exist_ok=True)
    (data / "corpus.txt").write_bytes(DATA)
    return LocalNodesJob(root, run_dir, root / "config.yaml", "--set", f"data.path={data}", *flags, nodes=2,
                         elastic_min=1, start=start, max_restarts=1)


def test_a_node_that_joins_later_doubles_the_world_and_every_sample_is_seen_once(tmp_path):
    (tmp_path / "shared").mkdir()
    run = RunDir(tmp_path / "shared" / "run")
    job = elastic_job(tmp_path, run.path, *SLOW)
    wait_for(lambda: run.events_path.exists() and len(run.events("train")) >= JOIN_AFTER, "node 0's first steps")
    job.start_node(1)
    assert job.wait(timeout=DEADLINE_S) == [0, 0], job.output(0) + job.output(1)

    status = run.read_status()
    assert status["state"] == "completed" and status["step"] == STEPS, status
    starts = [e for e in run.events("status") if e["state"] == "running"]
    assert len(starts) == 2 and starts[1]["resumed_step"] >= JOIN_AFTER, starts  # one process, then two
    changed_at = starts[1]["resumed_step"]
    assert "elastic: checkpointed step" in job.output(0)
    assert run.read_lineage()["parallel"]["processes"] == 2

    kept = kept_samples(run.path)
    assert sorted(kept) == list(range(1, STEPS + 1))
    assert {len(kept[s]) for s in range(1, changed_at + 1)} == {8}  # one replica's rows a step
    assert {len(kept[s]) for s in range(changed_at + 1, STEPS + 1)} == {16}  # then two replicas'
    seen = [sample for step in kept.values() for sample in step]
    assert len(seen) == len(set(seen)) == 8 * changed_at + 16 * (STEPS - changed_at)  # none twice
    # none skipped: the run took the first samples of its first epoch's order, every one of them
    n = load_corpus(run.read_config()).sample_count("train")
    assert len(seen) < n
    assert set(seen) == set(epoch_order(run.read_config().train.seed, 0, n)[: len(seen)].tolist())


def test_an_elastic_job_refuses_random_sampling_naming_the_field(tmp_path):
    (tmp_path / "shared").mkdir()
    job = elastic_job(tmp_path, tmp_path / "shared" / "run", "--set", "data.sampling=random", "--set",
                      "data.record_samples=false", start=2)
    assert job.wait(timeout=DEADLINE_S) == [2, 2]
    for k in range(2):
        assert "data.sampling: 'random' draws each step's rows by step and replica" in job.output(k)
        assert "allowed: 'epochs' in an elastic job (--nnodes MIN:MAX)" in job.output(k)
    assert not (tmp_path / "shared" / "run").exists()


def test_ranks_restarted_after_the_run_completed_end_without_training(finished_run_copy):
    """A node that joins as the last step finishes: torchrun restarts the ranks of a run that has just completed.
    An elastic rank finds nothing left to train and ends well, the run stays completed; a rank outside an elastic
    job is refused as before (its supervisor never restarts a completed run)."""
    run = finished_run_copy(*ONE_CHECKPOINT, name="done")  # 5 steps, shared with the untrusted-run tests
    before = run.status_path.read_bytes(), run.events_path.read_bytes()
    rank = [sys.executable, "-m", "toolkit.runs.worker", str(run.path)]
    elastic = subprocess.run(rank, capture_output=True, text=True, cwd=PROJECT, timeout=120,
                             env={**os.environ, ELASTIC_ENV: "1", "RANK": "1", "WORLD_SIZE": "2"})
    assert elastic.returncode == 0, elastic.stderr
    assert "elastic: the run completed at step 5 before the nodes changed; nothing left to train" in elastic.stderr
    assert (run.status_path.read_bytes(), run.events_path.read_bytes()) == before
    alone = subprocess.run(rank, capture_output=True, text=True, cwd=PROJECT, timeout=120)
    assert alone.returncode == 1 and "not allowed from state 'completed'" in alone.stderr, alone.stderr
