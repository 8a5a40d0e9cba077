"""Engine registry: ``engine.name`` picks how a model is wrapped, stepped and checkpointed.

Every engine is an :class:`Engine`: the trainer (toolkit.train.trainer.train_step) calls ``forward_backward`` for
each micro-batch of a step (a pipeline, ``pipelined``: ``forward_backward_step`` for all of them at once, in its
schedule's order) and then ``optimizer_step``. A batch is a dict of
tensors; the model's adapter ``loss_fn(model, batch)`` (toolkit.train.models.loss_function) turns it into the loss, so
engines know no model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol
from collections.abc import Callable

if TYPE_CHECKING:  # the CLI reads the registry's names (check_engine) on every call: no torch for that
    import torch


class Engine(Protocol):
    module: torch.nn.Module
    """The bare model (no DDP or DeepSpeed wrapper): what lineage, exports and checks read."""
    loss_fn: Callable
    """(model, batch) -> loss, the model's adapter (fault injection wraps it)."""
    update_skipped: bool
    """The last optimizer_step left its update out: its gradients were not finite (watchdog.nonfinite; the same on
    every rank)."""
    cheap_state_capture: bool
    """checkpoint_state hands out references, with no copy and no collective (so staging buffers can warm up)."""
    state_moves_in_forward: bool
    """Parameters are gathered and released inside forward (ZeRO-3): evaluation must keep every rank in step."""
    pipelined: bool
    """A pipeline over ranks (engine.pipeline_parallel): the step's micro-batches go to forward_backward_step
    together, as its schedule interleaves them across the stages."""
    deepspeed_config: dict | None
    """What DeepSpeed was handed (written beside the run for people to read); None for other engines."""
    skipped_steps: int
    """fp16: updates the loss scaler skipped for overflowing gradients."""
    loss_scale: float | None
    """fp16: the loss scale now; None otherwise."""

    def forward_backward(self, batch: dict, weight: float | None, n: int, last: bool) -> torch.Tensor:
        """One micro-batch of ``n``: its loss, and its gradients added to the step's (the loss weighted by its share
        of the step's targets, ``weight``; None: 1 / n). ``last``: the step's last micro-batch."""

    def forward_backward_step(self, micro_batches: list[dict], weights: list[float] | None) -> torch.Tensor:
        """Every micro-batch of the step at once (a pipelined engine only): the step's loss, its gradients added up,
        each micro-batch weighted as forward_backward's ``weight`` would."""

    def optimizer_step(self, before_update: Callable[[], None] | None = None) -> None:
        """The update from the step's gradients (clipped, checked, applied or left out); gradients cleared.
        ``before_update`` runs when the gradients are whole and the weights still the previous step's."""

    def eval_loss(self, batch: dict) -> torch.Tensor: ...

    def set_lr(self, lr: float) -> None: ...

    def train(self) -> None: ...

    def eval(self) -> None: ...

    def checkpoint_state(self, folder, is_writer: bool) -> dict:
        """Relative file name -> state to save (tensors referenced, not copied)."""

    def load_checkpoint_state(self, folder) -> None: ...


def _torch_engine(model, cfg, topo, loss_fn):
    from toolkit.train.engines.torch_engine import TorchEngine

    return TorchEngine(model, cfg, topo, loss_fn)


def _deepspeed_engine(model, cfg, topo, loss_fn):
    from toolkit.train.engines.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(model, cfg, topo, loss_fn)


def _fsdp_engine(model, cfg, topo, loss_fn):
    from toolkit.train.engines.fsdp_engine import FSDPEngine

    return FSDPEngine(model, cfg, topo, loss_fn)


ENGINES = {"torch": _torch_engine, "deepspeed": _deepspeed_engine, "fsdp": _fsdp_engine}


def build_engine(model, cfg, topo, loss_fn=None) -> Engine:
    """The engine ``cfg.engine.name`` names around ``model``; ``loss_fn`` defaults to the model's adapter."""
    if loss_fn is None:
        from toolkit.train.models import loss_function

        loss_fn = loss_function(cfg.model)
    return ENGINES[cfg.engine.name](model, cfg, topo, loss_fn)


def check_engine(cfg, world: int, cuda: bool | None = None, per_node: int | None = None) -> dict | None:
    """Before launch, on the machine the run will use (``world`` processes, GPUs when ``cuda``; None: this machine's,
    asked only when it matters): engine.tensor_parallel and engine.pipeline_parallel divisors of the world, fp16 only
    on GPUs, and for DeepSpeed the merged config through DeepSpeed's own parser (toolkit.deepspeed_config). Returns
    what DeepSpeed will be handed (None for the torch engine). ``per_node``: the processes on each node of a
    multi-node run, which a tensor-parallel group must not straddle. Raises ValueError naming the field."""
    from toolkit.errors import RefusedValue, not_allowed

    for field, size, group in (
        ("engine.tensor_parallel", cfg.engine.tensor_parallel, "tensor-parallel group"),
        ("engine.pipeline_parallel", cfg.engine.pipeline_parallel, "pipeline"),
    ):
        if world % size:
            raise RefusedValue(
                not_allowed(
                    field,
                    size,
                    f"a divisor of the run's {world} processes",
                    problem=f"does not divide the run's {world} processes (each {group} is a whole number of ranks)",
                )
            )
    model_ranks = cfg.engine.tensor_parallel * cfg.engine.pipeline_parallel
    if world % model_ranks:
        raise RefusedValue(
            not_allowed(
                "engine.nproc",
                world,
                f"a multiple of engine.tensor_parallel x engine.pipeline_parallel ({model_ranks})",
                problem=f"processes are not a whole number of replicas of {model_ranks} ranks (tensor_parallel "
                f"{cfg.engine.tensor_parallel} x pipeline_parallel {cfg.engine.pipeline_parallel})",
            )
        )
    if per_node is not None and per_node % cfg.engine.tensor_parallel:
        raise RefusedValue(
            not_allowed(
                "engine.tensor_parallel",
                cfg.engine.tensor_parallel,
                f"a divisor of the {per_node} processes of a node",
                problem=f"does not divide the {per_node} processes of a node: a group would straddle two nodes, and "
                "its all-reduces (4 a block, every step) belong on one node's NVLink",
            )
        )
    if cfg.engine.name != "deepspeed" and cfg.engine.precision != "fp16" and not cfg.train.compile:
        return None  # nothing device-dependent to check: no torch import (a second of CPU) in the launching process
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    from toolkit.train import compilation

    compilation.check(cfg, cuda)

    merged = None
    if cfg.engine.name == "deepspeed":  # first: where fp16 came from a user's file, its key is the one to name
        from toolkit import deepspeed_config

        merged = deepspeed_config.check(cfg, world, cuda)
    if cfg.engine.precision == "fp16" and not cuda:
        raise RefusedValue(
            not_allowed(
                "engine.precision",
                "fp16",
                "'bf16' or 'fp32' on a machine without a GPU",
                problem="needs a GPU (fp16 compute and its dynamic loss scaling)",
            )
        )
    return merged
