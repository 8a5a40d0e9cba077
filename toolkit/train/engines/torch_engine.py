"""Plain PyTorch: the model as is in one process, wrapped in DistributedDataParallel in several."""

from __future__ import annotations

import contextlib

import torch
from torch.nn.parallel import DistributedDataParallel

from toolkit import safe_load
from toolkit.train.engines.param_groups import (adamw_param_groups, load_trainable_state, trainable_only,
                                                trainable_state)


class TorchEngine:
    def __init__(self, model, cfg, topo, loss_fn):
        self.loss_fn = loss_fn  # (model, batch) -> loss: the model's adapter (toolkit.train.models)
        self.module = model.to(topo.device)
        if topo.world_size > 1:
            device_ids = [topo.device.index] if topo.device.type == "cuda" else None
            self.model = DistributedDataParallel(self.module, device_ids=device_ids)
        else:
            self.model = self.module
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            adamw_param_groups(self.module, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2))
        self.grad_clip = o.grad_clip
        self.trainable_only = trainable_only(cfg)  # LoRA: the adapters alone (the base is rebuilt, frozen)
        self.device = topo.device
        bf16 = cfg.engine.precision == "bf16"
        self._autocast = (lambda: torch.autocast(topo.device.type, dtype=torch.bfloat16)) if bf16 \
            else contextlib.nullcontext

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def train_step(self, batch: dict, before_update=None) -> torch.Tensor:
        with self._autocast():
            loss = self.loss_fn(self.model, batch)
        loss.backward()
        if self.grad_clip:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
        if before_update is not None:
            before_update()  # the last moment the weights are still those of the previous step
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    @torch.no_grad()
    def eval_loss(self, batch: dict) -> torch.Tensor:
        with self._autocast():
            return self.loss_fn(self.model, batch)

    cheap_state_capture = True  # state_dict() hands out references: no copy, no collective

    # DDP replicas are identical, so rank 0 alone writes the model and optimizer state.
    def checkpoint_state(self, folder, is_writer: bool) -> dict:
        if not is_writer:
            return {}
        weights = trainable_state(self.module) if self.trainable_only else self.module.state_dict()
        return {"model.pt": weights, "optimizer.pt": self.optimizer.state_dict()}

    def load_checkpoint_state(self, folder) -> None:
        # A run directory may be a copy from elsewhere: tensors and plain data only (toolkit.safe_load).
        weights = safe_load.load(folder / "model.pt", map_location=self.device)
        if self.trainable_only:
            load_trainable_state(self.module, weights, folder / "model.pt")
        else:
            self.module.load_state_dict(weights)
        self.optimizer.load_state_dict(safe_load.load(folder / "optimizer.pt", map_location=self.device))

    def train(self):
        self.model.train()

    def eval(self):
        self.model.eval()
