"""Engine registry: ``engine.name`` picks how a model is wrapped, stepped and (later) checkpointed.

An engine exposes the same five things, so the loop in toolkit.train.trainer never asks which one it has:
``module`` (the bare model), ``train_step(x, y) -> loss``, ``eval_loss(x, y) -> loss``, ``set_lr(lr)``,
and ``train()`` / ``eval()`` mode switches.
"""

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


def _torch_engine(model, cfg, topo):
    from toolkit.train.engines.torch_engine import TorchEngine

    return TorchEngine(model, cfg, topo)


def _deepspeed_engine(model, cfg, topo):
    from toolkit.train.engines.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(model, cfg, topo)


ENGINES = {"torch": _torch_engine, "deepspeed": _deepspeed_engine}


def build_engine(model, cfg, topo):
    return ENGINES[cfg.engine.name](model, cfg, topo)
