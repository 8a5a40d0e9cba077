"""Gradient accumulation's arithmetic (toolkit.train.engines.accumulation), in this process on a tiny GPT: n
micro-batches give the step of the one batch they make up, also when prompts are masked out of the loss, where
equal shares would not."""

from __future__ import annotations

import pytest
import torch

from toolkit import config as config_mod
from toolkit.data.batch import IGNORE_INDEX
from toolkit.train.distributed import Topology
from toolkit.train.engines import build_engine
from toolkit.train.engines.accumulation import micro_batch_weights, weighted_mean
from toolkit.train.models import build_model
from toolkit.train.trainer import train_step

CPU = Topology(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def masked_batch(rows: int = 8, length: int = 32) -> dict:
    """Instruction-tuning rows: each row's prompt (a different length per row) is masked out of the loss."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (rows, length), generator=generator)
    labels = torch.randint(0, 256, (rows, length), generator=generator)
    for row in range(rows):
        labels[row, : 3 * row + 1] = IGNORE_INDEX  # row r predicts length - 3r - 1 tokens
    return {"input_ids": ids, "labels": labels}


def one_step(micro_batches: list[dict], weights) -> tuple[float, dict]:
    """The loss and the gradients of one optimizer step of a fresh tiny GPT over ``micro_batches``."""
    cfg = config_mod.load("tiny", ["optim.grad_clip=0"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    engine = build_engine(model, cfg, CPU)
    grads = {}

    def keep_gradients():  # called just before the update, when the step's gradients are whole
        grads.update({name: p.grad.clone() for name, p in model.named_parameters()})

    loss = train_step(engine, micro_batches, weights, before_update=keep_gradients).item()
    return loss, grads


def test_equal_shares_need_no_weights_and_masked_ones_weigh_by_their_targets():
    whole = masked_batch()
    halves = [{k: v[:4] for k, v in whole.items()}, {k: v[4:] for k, v in whole.items()}]
    assert micro_batch_weights(halves[:1]) is None
    assert micro_batch_weights([{"input_ids": whole["input_ids"][:4]}] * 2) is None, "no labels: equal shares"
    unmasked = {"labels": torch.zeros(4, 8, dtype=torch.long)}
    assert micro_batch_weights([unmasked, unmasked]) is None
    targets = [int((h["labels"] != IGNORE_INDEX).sum()) for h in halves]
    assert micro_batch_weights(halves) == pytest.approx([t / sum(targets) for t in targets])
    assert weighted_mean([torch.tensor(1.0), torch.tensor(3.0)], None).item() == 2.0
    assert weighted_mean([torch.tensor(1.0), torch.tensor(3.0)], [0.25, 0.75]).item() == 2.5


def test_masked_micro_batches_step_exactly_as_the_whole_batch():
    whole = masked_batch()
    quarters = [{k: v[i:i + 2] for k, v in whole.items()} for i in range(0, 8, 2)]
    loss_whole, grads_whole = one_step([whole], None)
    loss_split, grads_split = one_step(quarters, micro_batch_weights(quarters))
    assert loss_split == pytest.approx(loss_whole, rel=1e-6)
    for name, value in grads_whole.items():
        torch.testing.assert_close(grads_split[name], value, rtol=1e-4, atol=1e-7, msg=name)
    # what the weights are for: equal shares count a token of a heavily masked micro-batch several times over
    loss_equal, grads_equal = one_step(quarters, None)
    assert abs(loss_equal - loss_whole) > 1e-3
    assert any(not torch.allclose(grads_equal[k], v, rtol=1e-2, atol=1e-6) for k, v in grads_whole.items())
