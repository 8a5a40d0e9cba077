"""What training minimizes (train.objective): the model's own loss, or DPO on preference pairs.

An objective is what the engines call as ``loss_fn``: (model, batch) -> the scalar loss to backpropagate. It may
also keep figures of its own over the steps since the last log line (DPO's rewards and log-probabilities): the
trainer collects them at each log interval and after each evaluation, on every rank (a collective), and they go into
the train and eval events, and from there to TensorBoard and MLflow (toolkit.train.scalars).

    objective = build_objective(cfg, model, device)    before the engine, which takes it as its loss_fn
    objective.collect("train" or "val", device)        the figures since the last collect, over all ranks
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from toolkit.data.batch import CHOSEN, IGNORE_INDEX, LABELS, REJECTED, half
from toolkit.train import distributed
from toolkit.train.scalars import DPO_FIGURES


class ModelLoss:
    """train.objective=model: the model's own loss (its adapter, toolkit.train.models.loss_function)."""

    bits_per_byte = True  # a cross entropy over tokens: validation reports bits per byte where the data allows
    rows_per_item = 1

    def __init__(self, loss_fn: Callable):
        self.loss_fn = loss_fn

    def __call__(self, model, batch: dict) -> torch.Tensor:
        return self.loss_fn(model, batch)

    def flops_per_token(self, training_flops: float) -> float:
        return training_flops

    def collect(self, split: str, device) -> dict[str, float]:
        return {}

    def uncounted(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's log-probability of its labelled tokens, summed (B,): the answer's, as labels mark only it."""
    per_token = F.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    )
    return -per_token.view(labels.shape).sum(-1)


def dpo_loss(
    chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss, chosen rewards, rejected rewards) from the policy's and the reference's summed log-probabilities of
    each pair's two answers, as TRL's DPOTrainer.dpo_loss computes them with loss_type='sigmoid'."""
    margin = (chosen - rejected) - (ref_chosen - ref_rejected)
    loss = -F.logsigmoid(beta * margin).mean()
    return loss, beta * (chosen - ref_chosen).detach(), beta * (rejected - ref_rejected).detach()


class AdapterOff:
    """The reference of a LoRA run: the model itself with its adapters switched off (no second copy)."""

    def __init__(self, peft_model):
        self.model = peft_model

    @contextlib.contextmanager
    def __call__(self) -> Iterator[torch.nn.Module]:
        with self.model.disable_adapter():
            yield self.model


class FrozenCopy:
    """The reference of a full fine-tune: the starting weights, built again and frozen (one more copy in memory)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model.eval().requires_grad_(False)

    @contextlib.contextmanager
    def __call__(self) -> Iterator[torch.nn.Module]:
        yield self.model


class DPO:
    """Direct Preference Optimization (Rafailov et al., 2023) on a batch of preference pairs. For a prompt x with a
    chosen answer w and a rejected one l, with log p(a|x) an answer's token log-probabilities summed:

        margin  = (log policy(w|x) - log policy(l|x)) - (log reference(w|x) - log reference(l|x))
        loss    = -log sigmoid(beta * margin), the mean over the pairs
        reward  = beta * (log policy(a|x) - log reference(a|x)), each answer's implicit reward (shown, not trained)

    The two halves go through the model as one batch of 2B rows (TRL's concatenated forward): one forward for the
    policy, one without gradients for the reference."""

    FIGURES = DPO_FIGURES  # the order _add sums them in
    bits_per_byte = False  # the loss is not a cross entropy over tokens
    rows_per_item = 2  # every pair is two rows of block_size tokens

    def __init__(self, beta: float, logits_fn: Callable, reference: AdapterOff | FrozenCopy):
        self.beta, self.logits_fn, self.reference = beta, logits_fn, reference
        self._sums: dict[str, torch.Tensor | None] = {"train": None, "val": None}
        self._counting = True

    def __call__(self, model, batch: dict) -> torch.Tensor:
        chosen, rejected = half(batch, CHOSEN), half(batch, REJECTED)
        both = {key: torch.cat([chosen[key], rejected[key]]) for key in chosen}
        pairs = len(chosen[LABELS])
        policy = sequence_logps(self.logits_fn(model, both), both[LABELS])
        with torch.no_grad(), self.reference() as reference:
            was_training = reference.training
            reference.eval()  # no dropout in the reference's log-probabilities
            ref = sequence_logps(self.logits_fn(reference, both), both[LABELS])
            reference.train(was_training)
        loss, chosen_rewards, rejected_rewards = dpo_loss(
            policy[:pairs], policy[pairs:], ref[:pairs], ref[pairs:], self.beta
        )
        if self._counting:
            self._add(
                "train" if torch.is_grad_enabled() else "val",
                torch.isfinite(loss),
                chosen_rewards,
                rejected_rewards,
                policy.detach()[:pairs],
                policy.detach()[pairs:],
            )
        return loss

    def _add(self, split: str, finite, chosen_rewards, rejected_rewards, chosen_logps, rejected_logps) -> None:
        """The batch's sums, on the device (no host sync per step), and its pair count last; nothing of a batch whose
        loss is not finite (a step the watchdog leaves out)."""
        sums = torch.stack(
            [
                chosen_rewards.sum(),
                rejected_rewards.sum(),
                (chosen_rewards - rejected_rewards).sum(),
                (chosen_rewards > rejected_rewards).float().sum(),
                chosen_logps.sum(),
                rejected_logps.sum(),
                torch.tensor(float(len(chosen_rewards)), device=chosen_rewards.device),
            ]
        ).to(torch.float64)
        sums = torch.where(finite, sums, torch.zeros_like(sums))
        before = self._sums[split]
        self._sums[split] = sums if before is None else before + sums

    def collect(self, split: str, device) -> dict[str, float]:
        """The means of FIGURES over the pairs since the last collect of ``split``, every rank's; then reset."""
        sums = self._sums[split]
        self._sums[split] = None
        *totals, pairs = distributed.all_reduce_sum(
            sums.tolist() if sums is not None else [0.0] * (len(self.FIGURES) + 1), device
        )
        return {name: total / pairs for name, total in zip(self.FIGURES, totals)} if pairs else {}

    @contextlib.contextmanager
    def uncounted(self) -> Iterator[None]:
        """Forwards that keep a collective in step but are not part of the figures (ZeRO-3's evaluation padding)."""
        self._counting = False
        try:
            yield
        finally:
            self._counting = True

    def flops_per_token(self, training_flops: float) -> float:
        """The policy's forward and backward (``training_flops``: about 6 per weight) and the reference's forward
        (about 2 per weight, a third of that)."""
        return training_flops * 4 / 3


def build_objective(cfg, model: torch.nn.Module, device: torch.device) -> ModelLoss | DPO:
    """The objective train.objective names, for ``model`` as prepare_model returned it (before any engine wraps it)."""
    from toolkit.train.engines.param_groups import HALF
    from toolkit.train.models import logits_function, loss_function, prepare_model

    if cfg.train.objective == "model":
        return ModelLoss(loss_function(cfg.model))
    if cfg.model.lora.rank:
        reference: AdapterOff | FrozenCopy = AdapterOff(model)
    else:  # the weights the run starts from, whether or not this process resumes (and so loads later ones)
        copy = prepare_model(cfg, pretrained=True)[0].to(device)
        half = HALF.get(cfg.engine.precision)
        if cfg.engine.name == "deepspeed" and half is not None:  # DeepSpeed runs the policy in half precision
            copy = copy.to(half)  # (no autocast): the reference computes as the policy does
        reference = FrozenCopy(copy)
    return DPO(cfg.train.dpo_beta, logits_function(cfg.model), reference)
