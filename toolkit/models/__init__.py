"""Model registry: a name in ``model.name`` maps to a builder and the dataset it trains on.

The training loop only needs ``model(inputs, targets) -> scalar loss``; everything model-specific
(the FLOPs formula for MFU, the dataset) lives in the registry entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ModelSpec:
    build: Callable  # (ModelConfig) -> torch.nn.Module
    dataset: str  # the data.dataset this model is trained on
    flops_per_item: Callable  # (model, ModelConfig) -> training FLOPs per token/sample (forward + backward)


def _build_gpt(cfg):
    from toolkit.models.gpt import GPT

    return GPT(cfg)


def _gpt_flops(model, cfg):
    from toolkit.models.gpt import training_flops_per_token

    return training_flops_per_token(model, cfg)


def _build_digits(cfg):
    from toolkit.models.digits_mlp import DigitsMLP

    return DigitsMLP(cfg)


def _mlp_flops(model, cfg):
    # Every weight is used once per sample in a matmul: 2 FLOPs forward, 4 backward.
    return 6 * sum(p.numel() for p in model.parameters() if p.dim() > 1)


MODELS: dict[str, ModelSpec] = {
    "gpt": ModelSpec(build=_build_gpt, dataset="pydoc", flops_per_item=_gpt_flops),
    "digits_mlp": ModelSpec(build=_build_digits, dataset="digits", flops_per_item=_mlp_flops),
}
