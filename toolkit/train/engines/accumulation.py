"""How the micro-batches of one optimizer step share its loss (train.grad_accum_steps > 1).

A step's loss is the mean over its predicted tokens. Split into micro-batches, each micro-batch's mean must weigh by
its share of those tokens, not equally: a prompt-masked batch (instruction tuning, padding) holds fewer targets in
some rows than in others, and equal shares would count a token of a short micro-batch more than one of a long one
(the accumulation error Hugging Face's Trainer fixed in transformers 4.46). With these weights, n micro-batches
give the gradient of the one batch they make up, whatever their masks.
"""

from __future__ import annotations

import torch

from toolkit.data.batch import IGNORE_INDEX, LABELS


def micro_batch_weights(micro_batches: list[dict]) -> list[float] | None:
    """Each micro-batch's share of the step's targets (labels that are not IGNORE_INDEX); None when the shares are
    equal (no labels to count, none masked, or as many in each): then each loss is simply divided by their number."""
    if len(micro_batches) == 1 or any(LABELS not in batch for batch in micro_batches):
        return None
    counts = [int((batch[LABELS] != IGNORE_INDEX).sum()) for batch in micro_batches]
    total = sum(counts)
    if total == 0 or len(set(counts)) == 1:
        return None
    return [count / total for count in counts]


def weighted_mean(losses: list[torch.Tensor], weights: list[float] | None) -> torch.Tensor:
    """The step's loss from its micro-batches' losses, as :func:`micro_batch_weights` shares it."""
    if len(losses) == 1:
        return losses[0]
    if weights is None:
        return torch.stack(losses).mean()
    return sum(loss * w for loss, w in zip(losses, weights))
