"""Plain PyTorch: the model as is in one process, wrapped in DistributedDataParallel in several, or split over them
(engine.tensor_parallel: toolkit.train.tensor_parallel; engine.pipeline_parallel: toolkit.train.pipeline_parallel)."""

from __future__ import annotations

import contextlib
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

from toolkit import safe_load
from toolkit.checkpoint.store import SHARDS, CheckpointError
from toolkit.errors import refused
from toolkit.train.compilation import compile_in_place
from toolkit.train.engines.param_groups import (
    HALF,
    adamw_param_groups,
    load_trainable_state,
    trainable_only,
    trainable_state,
)
from toolkit.train.watchdog import gradients_finite

SCALER_FILE = "scaler.pt"  # fp16 runs only


def _as_is(loss: torch.Tensor) -> torch.Tensor:
    return loss


def _replicated_value(loss) -> torch.Tensor:
    """loss_parallel's loss, a DTensor replicated over the group (the same value on every rank), as a plain tensor."""
    return loss.to_local()


def adamw_implementation(device: torch.device, groups: list[dict]) -> dict:
    """AdamW's fused kernel, on a GPU and on a CPU: one pass over each parameter for its whole update, instead of
    torch's default (on a CPU a loop over the tensors, several elementwise passes each; foreach on a GPU). On a CPU
    that default is a large share of a step (bench/bench_training.py, section 5).

    Not for parameters split by tensor parallelism (DTensors): a CPU run failed at its first update with the fused
    kernel ("got mixed torch.Tensor and DTensor"); torch's default path takes them."""
    dtensor = sys.modules.get("torch.distributed.tensor")  # loaded wherever a DTensor exists: no import for a check
    split = dtensor is not None and any(isinstance(p, dtensor.DTensor) for group in groups for p in group["params"])
    return {"fused": True} if device.type in ("cuda", "cpu") and not split else {}


def keep_implementation(optimizer: torch.optim.Optimizer) -> None:
    """After ``optimizer.load_state_dict``: each parameter group's kernel choice back to the one this engine made.
    Loading replaces the groups' settings with the saved ones, and a checkpoint may come from another layout (a
    fused group of one process resumed over tensor-parallel ranks) or from before the fused kernel was chosen."""
    for group in optimizer.param_groups:
        for flag in ("fused", "foreach"):
            group[flag] = optimizer.defaults[flag]


class TorchEngine:
    def __init__(self, model, cfg, topo, loss_fn):
        self.loss_fn = loss_fn  # (model, batch) -> loss: the model's adapter (toolkit.train.models)
        self.module = model.to(topo.device)
        self.split = None  # tensor parallelism: the (dp, tp) mesh of ranks
        self.pipeline = None  # pipeline parallelism: this rank's stage and its schedule
        self.pipelined = False  # forward_backward_step takes a step's micro-batches together (a pipeline's schedule)
        self._loss_parallel, self._whole = contextlib.nullcontext, _as_is
        self._wrap(cfg, topo)
        if cfg.train.compile:  # the wrapper when there is one: dynamo then splits graphs at DDP's buckets
            compile_in_place(self.model)
        o = cfg.optim
        groups = adamw_param_groups(self.module, o.weight_decay)
        self.optimizer = torch.optim.AdamW(
            groups, lr=o.lr, betas=(o.beta1, o.beta2), **adamw_implementation(topo.device, groups)
        )
        self.grad_clip = o.grad_clip
        self.trainable_only = trainable_only(cfg)  # LoRA: the adapters alone (the base is rebuilt, frozen)
        self.device = topo.device
        half = HALF.get(cfg.engine.precision)
        self._autocast = (lambda: torch.autocast(topo.device.type, dtype=half)) if half else contextlib.nullcontext
        # fp16's narrow range: scale the loss up so small gradients do not flush to zero, and skip a step whose
        # gradients overflowed (the scale then halves); bf16 has fp32's range and needs none of it
        self.scaler = torch.amp.GradScaler(topo.device.type) if cfg.engine.precision == "fp16" else None
        self._skipped = None  # optimizer steps the scaler skipped for inf/NaN gradients (a device tensor)
        # watchdog.nonfinite: leave out an update whose gradients are not finite (toolkit.train.watchdog). In fp16
        # that is the loss scaler's own business: it skips the step and halves the scale.
        self.watch_nonfinite = cfg.watchdog.nonfinite != "apply" and self.scaler is None
        self.update_skipped = False  # the last train_step left its update out

    def _wrap(self, cfg, topo) -> None:
        """How the model is spread over the processes: a pipeline stage, tensor-parallel slices, DDP, or as it is.
        Sets ``self.model``, what forward runs, and ``self.module`` to this rank's part of the model."""
        if topo.pipeline_parallel > 1:  # tensor parallelism within each stage too
            from toolkit.train import pipeline_parallel

            ranks = pipeline_parallel.mesh(
                topo.device.type, topo.world_size, topo.pipeline_parallel, topo.tensor_parallel
            )
            self.pipeline = pipeline_parallel.Pipeline(self.module, ranks, cfg.train.grad_accum_steps, topo.device)
            self.module = self.model = self.pipeline.module  # this rank's stage; no DDP (see optimizer_step)
            self.pipelined = True
            self.cheap_state_capture = False  # a checkpoint gathers every stage's tensors: a collective
        elif topo.tensor_parallel > 1:
            # imported only here: DTensor's import costs every other training process a second
            from torch.distributed.tensor.parallel import loss_parallel

            from toolkit.train import tensor_parallel

            self.tensor_parallel = tensor_parallel
            self.split = tensor_parallel.mesh(topo.device.type, topo.world_size, topo.tensor_parallel)
            # the built-in GPT's loss runs on vocabulary-split logits; a transformers model's are gathered first
            vocab_split = cfg.model.name == "gpt"
            tensor_parallel.parallelize(self.module, cfg.model.name, self.split["tp"], loss_parallel=vocab_split)
            if vocab_split:
                self._loss_parallel, self._whole = loss_parallel, _replicated_value
            self.model = self.module  # no DDP: gradients are averaged over the replicas in optimizer_step
            self.cheap_state_capture = False  # a checkpoint gathers the split tensors: a collective
        elif topo.world_size > 1:
            device_ids = [topo.device.index] if topo.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.module, device_ids=device_ids)
        else:
            self.model = self.module

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @property
    def skipped_steps(self) -> int:
        return int(self._skipped) if self._skipped is not None else 0

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler is not None else None

    def forward_backward(self, batch: dict, weight: float | None, n: int, last: bool) -> torch.Tensor:
        """One micro-batch of ``n``: its loss (returned, detached) and its gradients, added to those of the step's
        micro-batches before it, its loss weighted by ``weight`` (its share of the step's targets; None: 1 / n)."""
        # DDP all-reduces gradients during backward; on the inner micro-steps there is nothing to share yet, so only
        # the last backward communicates (1 all-reduce per optimizer step instead of n)
        inner = not last and self.model is not self.module
        with self.model.no_sync() if inner else contextlib.nullcontext(), self._loss_parallel():
            with self._autocast():
                loss = self.loss_fn(self.model, batch)
                share = loss if n == 1 else (loss / n if weight is None else loss * weight)
            (self.scaler.scale(share) if self.scaler is not None else share).backward()
        return self._whole(loss.detach())

    def forward_backward_step(self, micro_batches: list[dict], weights: list[float] | None) -> torch.Tensor:
        """A pipeline's step: every micro-batch through every stage in the schedule's order, their gradients added up
        (each loss weighted by its share of the step's targets, as ``weights`` would); returns the step's loss."""
        return self.pipeline.forward_backward(micro_batches, self._autocast)

    def optimizer_step(self, before_update=None) -> None:
        """The update from the step's gradients: unscaled (fp16), clipped, checked (watchdog.nonfinite), then applied
        or left out; the gradients cleared either way."""
        norm: torch.Tensor | None = None
        if self.split is not None:
            norm = self._split_gradients()
        elif self.pipeline is not None:
            self.pipeline.reduce_gradients()  # the tied weight's two halves, then over the replicas (DDP's job)
            norm = self.pipeline.clip_gradients(self.grad_clip)
        else:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            params = self.module.parameters()
            norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip) if self.grad_clip else None
        # after DDP's all-reduce: every rank holds the same gradients, and so takes the same decision
        self.update_skipped = self.watch_nonfinite and not gradients_finite(self.module.parameters(), norm)
        if before_update is not None:
            before_update()  # the last moment the weights are still those of the previous step
        if self.scaler is not None:
            if self._skipped is None:
                self._skipped = torch.zeros((), dtype=torch.int64, device=self.device)
            before = self.scaler._scale.clone()  # on the device: no host sync per step (read at log time)
            self.scaler.step(self.optimizer)  # skipped when the gradients hold inf or NaN
            self.scaler.update()  # and then the scale halves
            self._skipped += (self.scaler._scale < before).long()
        elif not self.update_skipped:  # left out, the weights and the optimizer's moments stay as they were
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _split_gradients(self) -> torch.Tensor:
        """Tensor parallelism: the gradients averaged over the data-parallel replicas (DDP's job elsewhere), then
        clipped; returns their global norm."""
        if self.split["dp"].size() > 1:
            self.tensor_parallel.all_reduce_gradients(self.module.parameters(), self.split["dp"].get_group())
        return self.tensor_parallel.clip_gradients(
            self.module.parameters(), self.grad_clip, self.split["tp"].get_group()
        )

    @torch.no_grad()
    def eval_loss(self, batch: dict) -> torch.Tensor:
        if self.pipeline is not None:
            return self.pipeline.eval_loss(batch, self._autocast)
        with self._autocast(), self._loss_parallel():
            return self._whole(self.loss_fn(self.model, batch))

    cheap_state_capture = True  # state_dict() hands out references: no copy, no collective
    state_moves_in_forward = False  # the state stays where it is during forward (ZeRO-3's does not)
    deepspeed_config = None  # not DeepSpeed: no config was handed to it

    # DDP replicas are identical, so rank 0 alone writes the model and optimizer state. Split (tensor-parallel)
    # tensors are gathered whole first, every rank taking part: the files are those of an unsplit run.
    def checkpoint_state(self, folder, is_writer: bool) -> dict:
        if self.split is not None:
            weights = self.tensor_parallel.whole_state_dict(self.module, keep=is_writer)
            optimizer = self.tensor_parallel.whole_optimizer_state(self.optimizer, keep=is_writer)
        elif self.pipeline is not None:
            weights = self.pipeline.whole_state_dict(keep=is_writer)
            optimizer = self.pipeline.whole_optimizer_state(self.optimizer, keep=is_writer)
        elif is_writer:
            weights = trainable_state(self.module) if self.trainable_only else self.module.state_dict()
            optimizer = self.optimizer.state_dict()
        if not is_writer:
            return {}
        files = {"model.pt": weights, "optimizer.pt": optimizer}
        if self.scaler is not None:  # fp16: the loss scale and its growth counter, for an exact resume
            files[SCALER_FILE] = {**self.scaler.state_dict(), "skipped_steps": self.skipped_steps}
        return files

    def load_checkpoint_state(self, folder) -> None:
        if (folder / SHARDS).is_dir():  # an FSDP run's shards: every rank's chunks read into whole tensors here
            self._load_shards(folder / SHARDS)
            return
        # A run directory may be a copy from elsewhere: tensors and plain data only (toolkit.safe_load).
        weights = safe_load.load(folder / "model.pt", map_location=self.device)
        optimizer = safe_load.load(folder / "optimizer.pt", map_location=self.device)
        if self.split is not None:  # whole tensors, written at any engine.tensor_parallel: this rank's slices
            self.module.load_state_dict(self.tensor_parallel.split_state_dict(self.module, weights))
            self.tensor_parallel.load_optimizer_state(self.optimizer, optimizer)
        elif self.pipeline is not None:  # whole tensors, written at any engine.pipeline_parallel: this stage's
            self.pipeline.load_state_dict(weights)
            self.pipeline.load_optimizer_state(self.optimizer, optimizer)
        else:
            if self.trainable_only:
                load_trainable_state(self.module, weights, folder / "model.pt")
            else:
                self.module.load_state_dict(weights)
            self.optimizer.load_state_dict(optimizer)
        keep_implementation(self.optimizer)
        if self.scaler is not None:
            state = safe_load.load(folder / SCALER_FILE)
            self._skipped = torch.tensor(state.pop("skipped_steps", 0), dtype=torch.int64, device=self.device)
            self.scaler.load_state_dict(state)

    def _load_shards(self, shards) -> None:
        if self.split is not None or self.pipeline is not None or self.scaler is not None:
            raise CheckpointError(
                refused(
                    "engine.name",
                    "torch cannot resume an FSDP run's shards split over ranks or with fp16 loss scaling",
                    "engine.tensor_parallel=1, engine.pipeline_parallel=1 and bf16 or fp32 (one process or DDP)",
                )
            )
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        from toolkit.checkpoint import sharded

        sharded.load_into(
            self.module,
            self.optimizer,
            shards,
            StateDictOptions(ignore_frozen_params=self.trainable_only, strict=not self.trainable_only),
        )
        keep_implementation(self.optimizer)

    def train(self):
        self.model.train()

    def eval(self):
        self.model.eval()
