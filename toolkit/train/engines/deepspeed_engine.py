"""DeepSpeed: ZeRO stages 0 to 3, fp32, bf16 or fp16 (GPU), on gloo (CPU) or NCCL (GPU); the config it gets is
toolkit.deepspeed_config's merge of the user's file and the run's fields."""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from pathlib import Path

import torch

from toolkit import safe_load
from toolkit.deepspeed_config import fall_back_to_torch_adam, merged
from toolkit.train.engines.param_groups import HALF, adamw_param_groups, trainable_only
from toolkit.train.watchdog import gradients_finite


DS_TAG = "ds"  # the sub-folder DeepSpeed's own files go in, inside each Trainbook checkpoint


class _CapturingCheckpointEngine:
    """DeepSpeed's CheckpointEngine interface, keeping each file's state dict in memory."""

    def __init__(self):
        self.files: dict[str, dict] = {}

    def create(self, info):
        pass

    def makedirs(self, path, exist_ok=False):
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path):
        self.files[path] = state_dict

    def load(self, path, map_location=None):
        return safe_load.load(path, map_location=map_location)

    def commit(self, info):
        return True

    def is_data_parallel_writer(self, dp_rank):
        return dp_rank == 0

    def is_decoupled(self):
        return False

    def preserves_storage_sharing(self):
        # False: DeepSpeed would otherwise clone every tensor on the training thread; our staging copies
        # them into compact buffers in the background anyway.
        return False

    def cleanup(self):
        pass


@contextlib.contextmanager
def _update_left_out(optimizer):
    """DeepSpeed's step without its optimizer's update: the weights and the moments stay as they were."""
    own = optimizer.__dict__.get("step")
    optimizer.step = lambda *args, **kwargs: None
    try:
        yield
    finally:
        if own is None:
            del optimizer.step  # the class's own again
        else:
            optimizer.step = own


class DeepSpeedEngine:
    cheap_state_capture = False  # capturing its state is itself a collective (the ZeRO partitions)
    pipelined = False  # micro-batches one by one (engine.pipeline_parallel is the torch engine's)

    def __init__(self, model, cfg, topo, loss_fn):
        from toolkit.third_party import import_deepspeed

        deepspeed = import_deepspeed()
        self.loss_fn = loss_fn  # (model, batch) -> loss: the model's adapter, called with DeepSpeed's engine

        model = model.to(topo.device)
        # the user's file (engine.deepspeed) merged with this run's fields, for the world this run really has
        self.deepspeed_config = merged(cfg, topo.world_size, cuda=topo.device.type == "cuda")  # the trainer writes it
        if topo.device.type == "cuda" and (why := fall_back_to_torch_adam(self.deepspeed_config)):
            if topo.is_main:
                print(
                    f"DeepSpeed steps with torch's AdamW (optimizer.params.torch_adam), not FusedAdam: {why}",
                    file=sys.stderr,
                    flush=True,
                )
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=adamw_param_groups(model, cfg.optim.weight_decay),
            config=copy.deepcopy(self.deepspeed_config),  # DeepSpeed fills in what it defaults; the run keeps the merge
        )
        if cfg.train.compile:
            self.engine.compile()  # DeepSpeed's own path: the module compiled in place, its hooks kept
        self.module = self.engine.module
        self.trainable_only = trainable_only(cfg)  # LoRA: checkpoints leave the frozen base out
        self.device = topo.device
        self._dtype = HALF.get(cfg.engine.precision)
        # ZeRO-3 gathers and releases parameters inside forward: stage its state before training goes on.
        self.state_moves_in_forward = cfg.engine.zero_stage == 3
        # watchdog.nonfinite (toolkit.train.watchdog). DeepSpeed's ZeRO and bf16 optimizers skip an update whose
        # gradients are not finite themselves (their overflow check all-reduces the verdict); stage 0 in fp32 hands
        # the update to the plain torch optimizer, which checks nothing, so there it is checked here. In fp16 a skip
        # is the loss scaler's business (an overflow halves the scale), not the watchdog's.
        self.watch_nonfinite = cfg.engine.precision != "fp16" and cfg.watchdog.nonfinite != "apply"
        self._check_here = self.watch_nonfinite and cfg.engine.zero_stage == 0 and self._dtype is None
        self.update_skipped = False  # the last train_step left its update out

    def set_lr(self, lr: float) -> None:
        # The ZeRO optimizers expose the wrapped optimizer's param_groups, so this reaches the real step.
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def _cast(self, batch: dict) -> dict:
        # bf16 mode keeps the weights in bf16, so float inputs (the digits features) must match them.
        if self._dtype is None:
            return batch
        return {k: v.to(self._dtype) if v.is_floating_point() else v for k, v in batch.items()}

    @property
    def skipped_steps(self) -> int:
        return self.engine.skipped_steps  # fp16 overflows (DeepSpeed's dynamic loss scaler skipped the update)

    @property
    def loss_scale(self) -> float | None:
        # loss_scale: what every fp16 optimizer of DeepSpeed 0.19 has (stage 0's FP16_Optimizer has no cur_scale)
        return float(self.engine.optimizer.loss_scale) if self._dtype is torch.float16 else None

    def forward_backward(self, batch: dict, weight: float | None, n: int, last: bool) -> torch.Tensor:
        """One micro-batch of ``n``: its loss (returned) and backward. DeepSpeed divides each backward by
        gradient_accumulation_steps itself, and takes a ``step()`` after each: inside the accumulation that is only
        bookkeeping; the last micro-batch's, the update, is :meth:`optimizer_step`'s."""
        loss = self.loss_fn(self.engine, self._cast(batch))
        # a share w of the step's targets goes in as w x n, since DeepSpeed divides by n
        self.engine.backward(loss if weight is None else loss * (weight * n))
        if not last:
            self.engine.step()
        return loss.detach().float()

    def optimizer_step(self, before_update=None) -> None:
        """The update at the accumulation boundary (clipping, ZeRO's reduction and the optimizer are DeepSpeed's), or
        left out where the gradients are not finite (watchdog.nonfinite)."""
        # stage 0 all-reduced the gradients in the last backward: every rank takes the same decision
        left_out = self._check_here and not gradients_finite(self.module.parameters())
        if before_update is not None:
            before_update()  # the last moment the weights are still those of the previous step
        with _update_left_out(self.engine.optimizer) if left_out else contextlib.nullcontext():
            self.engine.step()  # DeepSpeed's bookkeeping (step counts, zeroed gradients) as for any step
        self.update_skipped = self.watch_nonfinite and (left_out or not self.engine.was_step_applied())

    @torch.no_grad()
    def eval_loss(self, batch: dict) -> torch.Tensor:
        return self.loss_fn(self.engine, self._cast(batch)).float()

    def checkpoint_state(self, folder, is_writer: bool) -> dict:
        """The engine's own (ZeRO-partitioned) checkpoint files, captured in memory instead of written.

        DeepSpeed decides which rank saves what; a capturing checkpoint engine hands us each file's state
        dict, which toolkit.checkpoint.checkpointer stages and writes in the background under the same names, so
        ``engine.load_checkpoint`` reads them back unchanged.
        """
        capture = _CapturingCheckpointEngine()
        default, self.engine.checkpoint_engine = self.engine.checkpoint_engine, capture
        try:
            self.engine.save_checkpoint(
                str(folder), tag=DS_TAG, save_latest=False, exclude_frozen_parameters=self.trainable_only
            )
        finally:
            self.engine.checkpoint_engine = default
        return {str(Path(path).relative_to(folder)): state for path, state in capture.files.items()}

    def load_checkpoint_state(self, folder) -> None:
        # DeepSpeed's loader unpickles with weights_only=False; a copied run directory must not run code.
        capture = _CapturingCheckpointEngine()  # its load() is toolkit.safe_load's
        default, self.engine.checkpoint_engine = self.engine.checkpoint_engine, capture
        try:
            with safe_load.weights_only_everywhere():
                # without the frozen base in the file, its (rebuilt) weights must stay as they are
                path, _ = self.engine.load_checkpoint(
                    str(folder),
                    tag=DS_TAG,
                    load_optimizer_states=True,
                    load_lr_scheduler_states=False,
                    load_module_strict=not self.trainable_only,
                )
        finally:
            self.engine.checkpoint_engine = default
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint under {folder}/{DS_TAG}")

    def train(self):
        self.engine.train()

    def eval(self):
        self.engine.eval()
