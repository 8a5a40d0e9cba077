"""Low-rank adapters through peft (``model.lora``, rank 0 = off): after the model is built and its pretrained weights
loaded, the target modules get adapters and every other weight is frozen. The optimizer then sees only the adapters
(toolkit.train.engines.param_groups takes trainable parameters), and checkpoints hold only them: a resume rebuilds the
frozen base the same way (train.seed, hf.source, init_from) and loads the adapters over it.
"""

from __future__ import annotations

from toolkit.errors import RefusedValue, not_allowed, refused

# What peft can put an adapter on (by class name, so that transformers' Conv1D needs no import here).
ADAPTABLE = ("Linear", "Embedding", "Conv1d", "Conv2d", "Conv3d", "Conv1D", "MultiheadAttention")
SHOWN = 30  # module names a message lists at most
TASK_TYPES = {"causal_lm": "CAUSAL_LM", "sequence_classification": "SEQ_CLS"}  # SEQ_CLS also trains the new head


def enabled(cfg) -> bool:
    """Is LoRA on for this ModelConfig?"""
    return cfg.lora.rank > 0


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)  # peft's rule for a list of targets


def adaptable_names(model) -> list[str]:
    """The short names (last part) of the modules peft can adapt, in model order, each once; e.g. q_proj, v_proj."""
    seen = {}
    for name, module in model.named_modules():
        if name and type(module).__name__ in ADAPTABLE:
            seen.setdefault(name.rpartition(".")[2], name)
    return list(seen)


def default_targets(model) -> list[str] | None:
    """peft's default target modules for a transformers architecture (None: it has none)."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    model_type = getattr(getattr(model, "config", None), "model_type", None)
    found = DEFAULTS.get(model_type)
    return list(found) if found else None


def targets(model, cfg) -> list[str]:
    """model.lora.target_modules, or peft's default for the architecture; refused when there is neither."""
    if cfg.lora.target_modules:
        return list(cfg.lora.target_modules)
    found = default_targets(model)
    if found is None:
        model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
        raise RefusedValue(
            refused(
                "model.lora.target_modules",
                f"is empty and peft has no default for {model_type!r}",
                f"names of modules to adapt, e.g. {', '.join(adaptable_names(model)[:8])}",
            )
        )
    return found


def check_targets(model, cfg) -> None:
    """Every target names at least one module, and one peft can adapt; the message lists the ones that exist."""
    names = {name: type(module).__name__ for name, module in model.named_modules() if name}
    choices = adaptable_names(model)
    listed = ", ".join(choices[:SHOWN]) + (f" and {len(choices) - SHOWN} more" if len(choices) > SHOWN else "")
    for target in targets(model, cfg):
        kinds = {kind for name, kind in names.items() if _matches(name, target)}
        if not kinds:
            raise RefusedValue(
                not_allowed(
                    "model.lora.target_modules",
                    target,
                    f"names (or name suffixes) of this model's modules: {listed}",
                    problem="matches no module of the model",
                )
            )
        if not kinds & set(ADAPTABLE):
            raise RefusedValue(
                not_allowed(
                    "model.lora.target_modules",
                    target,
                    f"Linear, Embedding or Conv modules: {listed}",
                    problem=f"names {', '.join(sorted(kinds))} modules, which LoRA cannot adapt",
                )
            )


def wrap(model, cfg):
    """``model`` with adapters on the target modules and every other weight frozen (a peft PeftModel)."""
    import warnings

    from peft import LoraConfig, get_peft_model

    task = TASK_TYPES[cfg.hf.task] if cfg.name == "hf" else None
    config = LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=targets(model, cfg),
        task_type=task,
    )
    with warnings.catch_warnings():  # peft 0.21 asks transformers 5 with a name it deprecates: noise in every log
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        return get_peft_model(model, config)
