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
    dataset: str  # the built-in data.dataset this model is trained on
    asset_types: tuple  # data asset types it can train on (text: uri_file/uri_folder; tables: mltable)
    flops_per_item: Callable  # (model, ModelConfig) -> training FLOPs per token/sample (forward + backward)


def _build_gpt(cfg):
    from toolkit.train.models.gpt import GPT

    return GPT(cfg)


def _gpt_flops(model, cfg):
    from toolkit.train.models.gpt import training_flops_per_token

    return training_flops_per_token(model, cfg)


def _build_digits(cfg):
    from toolkit.train.models.digits_mlp import DigitsMLP

    return DigitsMLP(cfg)


def _mlp_flops(model, cfg):
    # Every weight is used once per sample in a matmul: 2 FLOPs forward, 4 backward.
    return 6 * sum(p.numel() for p in model.parameters() if p.dim() > 1)


MODELS: dict[str, ModelSpec] = {
    "gpt": ModelSpec(build=_build_gpt, dataset="pydoc", asset_types=("uri_file", "uri_folder"),
                     flops_per_item=_gpt_flops),
    "digits_mlp": ModelSpec(build=_build_digits, dataset="digits", asset_types=("mltable",),
                            flops_per_item=_mlp_flops),
}
