"""Model registry: ``model.name`` maps to how the model is built and how a batch becomes its loss (which data
it trains on is toolkit.config's to check).

The training loop knows nothing of any model. It asks the spec for these:

    model, origin = prepare_model(cfg)              the nn.Module a run trains: built, pretrained weights,
                                                    activation checkpointing, LoRA
    model = build_model(cfg.model)                  an nn.Module as the spec builds it
    loss_fn = loss_function(cfg.model)              loss_fn(model, batch) -> a scalar tensor (batch: see below)
    logits_fn = logits_function(cfg.model)          logits_fn(model, batch) -> (B, T, vocabulary), causal LMs only
    flops, how = flops_per_item(model, cfg.model)   training FLOPs per token or sample, for MFU, and their source

A batch is a dict of tensors, the same for every model of a kind of data (toolkit.data.batch says which keys).
Models with another calling convention bring an adapter (``loss``) rather than changing the loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable


@dataclass(frozen=True)
class ModelSpec:
    build: Callable  # (ModelConfig) -> torch.nn.Module
    loss: Callable  # (ModelConfig) -> the adapter: (model, batch dict) -> scalar loss tensor
    flops_per_item: Callable | None  # (model, ModelConfig) -> training FLOPs per token/sample (None: estimate)
    logits: Callable | None = None  # (model, text batch) -> logits (B, T, vocabulary): a causal LM's, for DPO


def _build_gpt(cfg):
    from toolkit.train.models.gpt import GPT

    return GPT(cfg)


def _gpt_flops(model, cfg):
    from toolkit.train.models.gpt import training_flops_per_token

    return training_flops_per_token(model, cfg)


def _build_digits(cfg):
    from toolkit.train.models.digits_mlp import DigitsMLP

    return DigitsMLP(cfg)


def matmul_flops(model, cfg=None) -> float:
    """6 x the weights of matrices: each is used once per item in a matmul, 2 FLOPs forward and 4 backward (an
    estimate for a model without its own formula: it leaves out attention scores and any reused weight)."""
    return 6 * sum(p.numel() for p in model.parameters() if p.dim() > 1)


def _text_loss(model, batch):
    if "position_ids" in batch:  # packed rows
        return model(batch["input_ids"], batch["labels"], position_ids=batch["position_ids"])
    return model(batch["input_ids"], batch["labels"])


def _gpt_logits(model, batch):
    return model(batch["input_ids"], position_ids=batch.get("position_ids"))


def _hf_logits(model, batch):
    from toolkit.train.models import hf

    return hf.causal_lm_logits(model, batch)


def _table_loss(model, batch):
    return model(batch["inputs"], batch["labels"])


def _build_custom(cfg):
    from toolkit.train.models import custom

    return custom.build(cfg)


def _custom_loss(cfg):
    from toolkit.train.models import custom

    return custom.loss_function(cfg)


def _build_hf(cfg):
    from toolkit.train.models import hf

    return hf.build(cfg)


def _hf_loss(cfg):
    from toolkit.train.models import hf

    return hf.loss_function(cfg)


def _hf_flops(model, cfg):
    from toolkit.train.models import hf

    return hf.training_flops_per_token(model, cfg)


# Which data each model trains on is toolkit.config's (builtin_datasets, ASSET_TYPES), which validates it.
MODELS: dict[str, ModelSpec] = {
    "gpt": ModelSpec(build=_build_gpt, loss=lambda cfg: _text_loss, flops_per_item=_gpt_flops, logits=_gpt_logits),
    "digits_mlp": ModelSpec(build=_build_digits, loss=lambda cfg: _table_loss, flops_per_item=matmul_flops),
    "hf": ModelSpec(build=_build_hf, loss=_hf_loss, flops_per_item=_hf_flops, logits=_hf_logits),
    "custom": ModelSpec(build=_build_custom, loss=_custom_loss, flops_per_item=None),
}


def build_model(cfg):
    """The nn.Module ``cfg`` (a ModelConfig) names, with the spec's own initialisation."""
    return MODELS[cfg.name].build(cfg)


def prepare_model(cfg, pretrained: bool = True):
    """The model a run trains, the same in every process and at every resume (``cfg`` is the whole Config): seeded
    with train.seed, built by its spec, then model.init_from's weights, model.activation_checkpointing, then
    model.lora's adapters. ``pretrained`` False skips init_from (a resumed run without LoRA takes every weight from
    its checkpoint; with LoRA the frozen base must be rebuilt, so it always loads). Returns (model, lineage of the
    pretrained weights: {} when none)."""
    import torch

    torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank and at every rebuild
    model = build_model(cfg.model)
    if cfg.model.name == "hf":
        from toolkit.train.models import hf

        hf.adopt_tokenizer_ids(model, cfg)
    origin = {}
    if cfg.model.init_from and (pretrained or cfg.model.lora.rank):
        from toolkit.train.models import init_from

        origin = init_from.apply(model, cfg.model)
    if cfg.model.activation_checkpointing:
        # before LoRA, the order peft documents: get_peft_model then prepares the checkpointed base for it
        enable_activation_checkpointing(model, cfg.model)
    if cfg.model.lora.rank:
        from toolkit.train.models import lora

        model = lora.wrap(model, cfg.model)
    return model, origin


def enable_activation_checkpointing(model, cfg) -> None:
    """model.activation_checkpointing on a built model (``cfg`` a ModelConfig): the built-in GPT reads it as it is
    built; a transformers model and the user's module (through its gradient_checkpointing_enable) are told here."""
    if cfg.name == "hf":
        from toolkit.train.models import hf

        hf.check_activation_checkpointing(cfg, model)
        hf.enable_activation_checkpointing(model)
    elif cfg.name == "custom":
        from toolkit.train.models import custom

        custom.enable_activation_checkpointing(cfg, model)


def loss_function(cfg):
    """(model, batch) -> scalar loss, for the model ``cfg`` (a ModelConfig) names."""
    return MODELS[cfg.name].loss(cfg)


def logits_function(cfg):
    """(model, text batch) -> logits, for the causal language model ``cfg`` (a ModelConfig) names (the config
    allows DPO on no other)."""
    found = MODELS[cfg.name].logits
    assert found is not None, f"model.name={cfg.name!r} has no logits (toolkit.config refuses DPO on it)"
    return found


def flops_per_item(model, cfg) -> tuple[float, str]:
    """Training FLOPs per token or sample, and where the figure comes from: model.flops_per_item when set, the
    model's own formula, else an estimate of 6 x the matrix weights (MFU is then an estimate, and says so)."""
    if cfg.flops_per_item:
        return float(cfg.flops_per_item), "model.flops_per_item"
    formula = MODELS[cfg.name].flops_per_item
    flops = formula(model, cfg) if formula is not None else None
    if flops is not None:
        return float(flops), f"the {cfg.name} formula"
    return float(matmul_flops(model)), "estimated as 6 x parameters (set model.flops_per_item for an exact MFU)"


def model_overrides(text: str) -> list[str]:
    """The config settings (``--set`` strings) that train the model ``text`` names: an import path
    ('package.module:function' or 'file.py:function') becomes a custom model, a folder in save_pretrained layout
    a Hugging Face one (its own weights and config); empty: none (the config's model). For forms and flags that
    take "your model" as one string."""
    from pathlib import Path

    from toolkit.errors import RefusedValue, not_allowed

    text = text.strip()
    if not text:
        return []
    if Path(text).expanduser().is_dir():
        return [
            "model.name=hf",
            f"model.hf.source={Path(text).expanduser()}",
            "model.hf.architecture=",
            "model.hf.config={}",
            "model.factory=",
            "model.loss=",
        ]
    where, sep, attr = text.rpartition(":")
    if sep and where and attr.isidentifier():
        return [
            "model.name=custom",
            f"model.factory={text}",
            "model.hf.architecture=",
            "model.hf.config={}",
            "model.hf.source=",
        ]
    raise RefusedValue(
        not_allowed(
            "model",
            text,
            "'package.module:function', 'path/to/file.py:function' or a folder in save_pretrained layout",
            problem="is neither an import path nor a folder",
        )
    )
