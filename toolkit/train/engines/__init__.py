"""Engine registry: ``engine.name`` picks how a model is wrapped, stepped and (later) checkpointed.

An engine exposes the same five things, so the loop in toolkit.train.trainer never asks which one it has:
``module`` (the bare model), ``train_step(micro_batches, weights) -> loss`` (one optimizer step; several
micro-batches with train.grad_accum_steps), ``eval_loss(batch) -> loss``, ``set_lr(lr)``,
and ``train()`` / ``eval()`` mode switches. A batch is a dict of tensors; the model's adapter ``loss_fn(model,
batch)`` (toolkit.train.models.loss_function) turns it into the loss, so engines know no model. After each
``train_step``, ``update_skipped`` says whether it left its update out for non-finite gradients (watchdog.nonfinite;
the same on every rank, toolkit.train.watchdog).
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


def check_engine(cfg, world: int, cuda: bool | None = None) -> dict | None:
    """Before launch, on the machine the run will use (``world`` processes, GPUs when ``cuda``; None: this machine's,
    asked only when it matters): fp16 only on GPUs, and for DeepSpeed the merged config through DeepSpeed's own
    parser (toolkit.train.engines.deepspeed_config). Returns what DeepSpeed will be handed (None for the torch
    engine). Raises ValueError naming the field."""
    from toolkit.errors import not_allowed

    if cfg.engine.name != "deepspeed" and cfg.engine.precision != "fp16" and not cfg.train.compile:
        return None  # nothing device-dependent to check: no torch import (a second of CPU) in the launching process
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    from toolkit.train import compilation

    compilation.check(cfg, cuda)

    merged = None
    if cfg.engine.name == "deepspeed":  # first: where fp16 came from a user's file, its key is the one to name
        from toolkit.train.engines import deepspeed_config

        merged = deepspeed_config.check(cfg, world, cuda)
    if cfg.engine.precision == "fp16" and not cuda:
        raise ValueError(not_allowed("engine.precision", "fp16", "'bf16' or 'fp32' on a machine without a GPU",
                                     problem="needs a GPU (fp16 compute and its dynamic loss scaling)"))
    return merged
