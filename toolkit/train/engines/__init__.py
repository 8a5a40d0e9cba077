"""Engine registry: ``engine.name`` picks how a model is wrapped, stepped and (later) checkpointed.

An engine exposes the same five things, so the loop in toolkit.train.trainer never asks which one it has:
``module`` (the bare model), ``train_step(x, y) -> loss``, ``eval_loss(x, y) -> loss``, ``set_lr(lr)``,
and ``train()`` / ``eval()`` mode switches.
"""

from __future__ import annotations


def _torch_engine(model, cfg, topo):
    from toolkit.train.engines.torch_engine import TorchEngine

    return TorchEngine(model, cfg, topo)


def _deepspeed_engine(model, cfg, topo):
    from toolkit.train.engines.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(model, cfg, topo)


ENGINES = {"torch": _torch_engine, "deepspeed": _deepspeed_engine}


def build_engine(model, cfg, topo):
    return ENGINES[cfg.engine.name](model, cfg, topo)
