"""Engine registry: ``engine.name`` picks how a model is wrapped, stepped and (later) checkpointed.

An engine exposes the same five things, so the loop in toolkit.train.trainer never asks which one it has:
``module`` (the bare model), ``train_step(batch) -> loss``, ``eval_loss(batch) -> loss``, ``set_lr(lr)``,
and ``train()`` / ``eval()`` mode switches. A batch is a dict of tensors; the model's adapter ``loss_fn(model,
batch)`` (toolkit.train.models.loss_function) turns it into the loss, so engines know no model.
"""

from __future__ import annotations


def _torch_engine(model, cfg, topo, loss_fn):
    from toolkit.train.engines.torch_engine import TorchEngine

    return TorchEngine(model, cfg, topo, loss_fn)


def _deepspeed_engine(model, cfg, topo, loss_fn):
    from toolkit.train.engines.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(model, cfg, topo, loss_fn)


ENGINES = {"torch": _torch_engine, "deepspeed": _deepspeed_engine}


def build_engine(model, cfg, topo, loss_fn=None):
    """The engine ``cfg.engine.name`` names around ``model``; ``loss_fn`` defaults to the model's adapter."""
    if loss_fn is None:
        from toolkit.train.models import loss_function

        loss_fn = loss_function(cfg.model)
    return ENGINES[cfg.engine.name](model, cfg, topo, loss_fn)
