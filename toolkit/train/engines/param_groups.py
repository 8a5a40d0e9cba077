"""The optimizer's parameter groups, shared by every engine."""

from __future__ import annotations

import torch

# engine.precision -> the half-precision dtype that autocast computes in (fp32: none)
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


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


def trainable_only(cfg) -> bool:
    """Do checkpoints hold only the trainable weights? With LoRA (model.lora.rank > 0): the frozen base is rebuilt
    from train.seed, model.hf.source and model.init_from, so saving it again at every checkpoint would only cost."""
    return cfg.model.lora.rank > 0


def trainable_state(model: torch.nn.Module) -> dict:
    """The state dict's entries of the parameters that train (references, as state_dict gives them)."""
    names = {name for name, p in model.named_parameters() if p.requires_grad}
    return {k: v for k, v in model.state_dict().items() if k in names}


def load_trainable_state(model: torch.nn.Module, state: dict, where) -> None:
    """Load a :func:`trainable_state` over a rebuilt model: exactly its trainable tensors, nothing else."""
    result = model.load_state_dict(state, strict=False)
    frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    frozen |= {name for name, _ in model.named_buffers()}
    missing = [k for k in result.missing_keys if k not in frozen]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"{where}: the saved trainable weights do not fit this model (missing {missing[:3]}, "
            f"unexpected {result.unexpected_keys[:3]})"
        )
