"""DeepSpeed: ZeRO stages 0 to 3, fp32 or bf16, on gloo (CPU) or NCCL (GPU)."""

from __future__ import annotations

import torch

from toolkit.engines import adamw_param_groups


def deepspeed_config(cfg) -> dict:
    """The DeepSpeed JSON config that a Trainbook config means (also written to the run for inspection)."""
    o = cfg.optim
    return {
        "train_micro_batch_size_per_gpu": cfg.train.batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": o.grad_clip,
        # torch_adam: DeepSpeed's fused CPU/GPU Adam would need a C++/CUDA build; torch's AdamW needs none.
        "optimizer": {"type": "AdamW",
                      "params": {"lr": o.lr, "betas": [o.beta1, o.beta2], "torch_adam": True}},
        "zero_optimization": {"stage": cfg.engine.zero_stage},
        "bf16": {"enabled": cfg.engine.precision == "bf16"},
        "steps_per_print": 2**62,  # the loop reports progress itself
        "wall_clock_breakdown": False,
    }


class DeepSpeedEngine:
    def __init__(self, model, cfg, topo):
        import deepspeed

        model = model.to(topo.device)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model,
            model_parameters=adamw_param_groups(model, cfg.optim.weight_decay),
            config=deepspeed_config(cfg),
        )
        self.module = self.engine.module
        self.device = topo.device
        self._dtype = torch.bfloat16 if cfg.engine.precision == "bf16" else None

    def set_lr(self, lr: float) -> None:
        # The ZeRO optimizers expose the wrapped optimizer's param_groups, so this reaches the real step.
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr

    def _cast(self, x):
        # bf16 mode keeps the weights in bf16, so float inputs (the digits features) must match them.
        return x.to(self._dtype) if self._dtype is not None and x.is_floating_point() else x

    def train_step(self, x, y) -> torch.Tensor:
        loss = self.engine(self._cast(x), y)
        self.engine.backward(loss)
        self.engine.step()
        return loss.detach().float()

    @torch.no_grad()
    def eval_loss(self, x, y) -> torch.Tensor:
        return self.engine(self._cast(x), y).float()

    def train(self):
        self.engine.train()

    def eval(self):
        self.engine.eval()
