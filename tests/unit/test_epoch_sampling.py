"""data.sampling=epochs (toolkit.data.epochs): every sample once an epoch, each replica its slice of each step, and a
position in samples that lets a run change its number of replicas without seeing a sample twice or skipping one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from toolkit import config as config_mod
from toolkit.checkpoint.store import CheckpointError, check_compatible
from toolkit.data.corpus import TableCorpus
from toolkit.data.epochs import EpochBatches, SampleRecord, epoch_order, kept_samples


def table(n: int) -> TableCorpus:
    """n rows whose one feature is the row's number before the corpus's own fixed shuffle."""
    return TableCorpus("t", np.arange(n, dtype=np.float32)[:, None], np.zeros(n, dtype=np.int64), val_fraction=0.2)


def taken(corpus, rows, replicas, steps, first_step=0, position=0) -> list[list[int]]:
    """Each step's samples, every replica's slice in replica order."""
    loaders = [EpochBatches(corpus, rows, 7, r, replicas, first_step, position) for r in range(replicas)]
    return [[int(i) for loader in loaders for i in loader[step]["sample_ids"]] for step in range(first_step, steps)]


def test_an_epoch_takes_every_sample_once_and_the_next_epoch_another_order():
    corpus = table(50)  # 40 training rows
    steps = taken(corpus, rows=4, replicas=2, steps=10)  # 10 steps x 8 = 80 = two epochs
    first, second = sum(steps[:5], []), sum(steps[5:], [])
    assert sorted(first) == sorted(second) == list(range(40)) and first != second
    assert first == epoch_order(7, 0, 40).tolist()


def test_a_step_that_straddles_two_epochs_takes_the_end_of_one_and_the_start_of_the_next():
    corpus = table(50)
    step = taken(corpus, rows=6, replicas=1, steps=7)[6]  # positions 36 .. 41
    assert step == epoch_order(7, 0, 40)[36:].tolist() + epoch_order(7, 1, 40)[:2].tolist()


def test_a_change_of_replicas_at_a_resume_goes_on_from_the_position_without_a_gap():
    corpus = table(200)  # 160 training rows
    before = taken(corpus, rows=4, replicas=1, steps=5)  # 20 samples
    after = taken(corpus, rows=4, replicas=3, steps=9, first_step=5, position=20)  # 4 steps x 12
    seen = sum(before + after, [])
    assert seen == epoch_order(7, 0, 160)[:68].tolist()


def test_a_batch_holds_the_samples_it_names():
    corpus = table(50)
    batch = EpochBatches(corpus, 5, 7, 0, 1, 0, 0)[0]
    assert torch.equal(batch["inputs"], corpus.splits["train"].inputs[batch["sample_ids"]])


def load(overrides):
    return config_mod.load("tiny", overrides)


def test_packed_rows_and_a_record_of_random_draws_are_refused_naming_the_field():
    with pytest.raises(config_mod.ConfigError, match="data.pack: True packs a varying number of samples a row"):
        load(["data.sampling=epochs", "data.pack=true", "data.chat=messages"])
    with pytest.raises(config_mod.ConfigError, match="data.record_samples: True records numbered samples"):
        load(["data.record_samples=true"])


def test_a_checkpoint_of_an_epochs_run_resumes_at_another_number_of_replicas():
    written = load(["data.sampling=epochs"]).to_dict()
    manifest = {"step": 20, "world_size": 1, "config": written}
    check_compatible(manifest, load(["data.sampling=epochs", "engine.nproc=2"]).to_dict(), 2)
    random = {"step": 20, "world_size": 1, "config": load([]).to_dict()}
    with pytest.raises(CheckpointError, match="2 data-parallel replicas where it had 1"):
        check_compatible(random, load(["engine.nproc=2"]).to_dict(), 2)


def test_a_record_never_writes_or_reads_through_a_link_of_a_copied_run(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("kept\n")
    (tmp_path / "run" / "samples").mkdir(parents=True)
    (tmp_path / "run" / "samples" / "replica_00000.jsonl").symlink_to(outside)
    with pytest.raises(OSError, match="is a link"):
        SampleRecord(tmp_path / "run", 0, 1.0)
    with pytest.raises(ValueError, match="is a symbolic link"):
        kept_samples(tmp_path / "run")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "samples").symlink_to(tmp_path / "run" / "samples", target_is_directory=True)
    with pytest.raises(OSError, match="samples: .* is a link"):
        SampleRecord(tmp_path / "linked", 1, 1.0)
    assert outside.read_text() == "kept\n"
