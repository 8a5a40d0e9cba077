"""The optimizer's parameter groups, shared by every engine."""

from __future__ import annotations

import torch


def adamw_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (weights, embeddings), not biases or norm gains, as in GPT-2 and nanoGPT."""
    params = [p for p in model.parameters() if p.requires_grad]
    seen, decay, no_decay = set(), [], []
    for p in params:
        if id(p) in seen:  # tied weights appear once
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
