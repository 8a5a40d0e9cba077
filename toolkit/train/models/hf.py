"""Hugging Face transformers models (``model.name: hf``): built from a config, or loaded from a folder in
``save_pretrained`` layout (its weights included).

    model:
      name: hf
      hf:
        architecture: llama            # a transformers model type
        config: {hidden_size: 128, intermediate_size: 344, num_hidden_layers: 4, num_attention_heads: 4,
                 num_key_value_heads: 4, vocab_size: 256, max_position_embeddings: 256}
    # or
      hf: {source: path/to/folder}     # config.json + model.safetensors, as save_pretrained writes them

Nothing is downloaded here: a hub id only resolves on a machine with a network (transformers' own cache rules).
Weights are read from safetensors only (a pickled pytorch_model.bin is refused before launch: see
toolkit.catalogue.pretrained).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path

from toolkit import fsio
from toolkit.data.batch import IGNORE_INDEX
from toolkit.errors import RefusedValue, not_allowed
from toolkit.safe_load import HF_NO_REMOTE_CODE

TASKS = {"causal_lm": "AutoModelForCausalLM", "sequence_classification": "AutoModelForSequenceClassification"}


def auto_class(cfg):
    import transformers

    return getattr(transformers, TASKS[cfg.hf.task])


def source_folder(cfg) -> Path | None:
    """model.hf.source as the folder on this machine it names, checked file by file before transformers reads any
    (toolkit.fsio.check_plain_folder: a folder from elsewhere); None for a hub id (transformers' cache is its own)."""
    from toolkit.catalogue.pretrained import PretrainedError

    folder = Path(cfg.hf.source).expanduser()
    if not cfg.hf.source or not folder.is_dir():
        return None
    fsio.check_plain_folder(folder, field="model.hf.source", error=PretrainedError)
    return folder


def hf_config(cfg):
    """The transformers config the model is built from (read from the folder, or made from the architecture)."""
    from transformers import AutoConfig

    if cfg.hf.source:
        source_folder(cfg)  # before any of its files is opened: build() reads its weights and generation config next
        config = AutoConfig.from_pretrained(cfg.hf.source, **HF_NO_REMOTE_CODE)
    else:
        config = AutoConfig.for_model(cfg.hf.architecture, **cfg.hf.config)
    if cfg.hf.task == "sequence_classification":
        config.num_labels = cfg.hf.num_labels
    return config


def build(cfg):
    """The model: the folder's weights with hf.source, else fresh weights (seeded by the caller's torch seed)."""
    import torch

    cls = auto_class(cfg)
    config = hf_config(cfg)
    if cfg.hf.source:
        # float32 whatever the folder's dtype: the engines keep fp32 weights (bf16 is autocast or DeepSpeed's own)
        return cls.from_pretrained(
            cfg.hf.source, config=config, use_safetensors=True, dtype=torch.float32, **HF_NO_REMOTE_CODE
        )
    return cls.from_config(config)


def build_empty(cfg):
    """The model's structure on the meta device (shapes, no weights, nothing allocated or read): what the pre-launch
    checks need, at any model size."""
    import torch

    with torch.device("meta"):
        return auto_class(cfg).from_config(hf_config(cfg))


# --- before launch ------------------------------------------------------------------------------------------------

EXAMPLES = ("llama", "gpt2", "gpt_neox", "mistral", "qwen2", "bert")


def _task_models(task: str) -> dict:
    from transformers.models.auto import modeling_auto

    return {
        "causal_lm": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        "sequence_classification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    }[task]


def check_architecture(cfg) -> None:
    """model.hf.architecture must be a transformers model type with a model for model.hf.task."""
    from transformers import CONFIG_MAPPING

    arch, task = cfg.hf.architecture, cfg.hf.task
    fits = _task_models(task)
    examples = ", ".join(e for e in EXAMPLES if e in fits)
    if arch not in CONFIG_MAPPING:
        close = difflib.get_close_matches(arch, list(CONFIG_MAPPING.keys()), n=3)
        raise RefusedValue(
            not_allowed(
                "model.hf.architecture",
                arch,
                f"a transformers model type such as {examples} ({len(fits)} fit {task})",
                problem="is not a transformers architecture" + (f" (close: {', '.join(close)})" if close else ""),
            )
        )
    if arch not in fits:
        raise RefusedValue(
            not_allowed(
                "model.hf.architecture",
                arch,
                f"one with a {task} model, such as {examples}",
                problem=f"has no {task} model in transformers",
            )
        )


def _looks_like_path(source: str) -> bool:
    return source.startswith(("/", ".", "~")) or Path(source).expanduser().exists()


def check_source(cfg) -> None:
    """A model.hf.source folder holds config.json and safetensors weights; a hub id must resolve (a network, or
    transformers' cache)."""
    from toolkit.catalogue.pretrained import PretrainedError, weight_files

    source = cfg.hf.source
    folder = source_folder(cfg)
    if folder is not None:
        if not (folder / "config.json").is_file():
            raise PretrainedError(
                not_allowed(
                    "model.hf.source",
                    source,
                    "a save_pretrained folder (config.json and safetensors weights)",
                    problem="has no config.json",
                )
            )
        weight_files(folder, "model.hf.source")
        return
    if _looks_like_path(source):
        raise PretrainedError(
            not_allowed("model.hf.source", source, "a save_pretrained folder, or a hub id", problem="is not a folder")
        )
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(source, **HF_NO_REMOTE_CODE)
    except Exception as exc:  # offline, unknown id, gated repository: transformers' own wording, first line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PretrainedError(
            not_allowed(
                "model.hf.source",
                source,
                "a save_pretrained folder on this machine, or a hub id where the machine has a network",
                problem=f"is not a folder, and as a hub id it cannot be read ({reason})",
            )
        ) from None


def check_context(cfg, model) -> None:
    """model.block_size (the training sequence length) fits the model's position table."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, int) and cfg.block_size > limit:
        raise RefusedValue(
            not_allowed(
                "model.block_size",
                cfg.block_size,
                f"<= {limit}",
                problem=f"is longer than the model's max_position_embeddings={limit}",
            )
        )


def pin(cfg):
    """``cfg`` (a ModelConfig) with a relative model.hf.source folder made absolute."""
    folder = Path(cfg.hf.source).expanduser()
    if not cfg.hf.source or not folder.is_dir():
        return cfg
    return dataclasses.replace(cfg, hf=dataclasses.replace(cfg.hf, source=str(folder.resolve())))


def training_flops_per_token(model, cfg) -> float | None:
    """6N + 12 * layers * width * context, as for the built-in GPT (toolkit.train.models.gpt), when the config
    names its layers and width; N leaves out embedding tables used only as lookups (a tied output embedding counts,
    as the lm_head matmul). None: no such fields, the caller estimates."""
    import torch.nn as nn

    config = getattr(model, "config", None)
    layers, width = getattr(config, "num_hidden_layers", None), getattr(config, "hidden_size", None)
    if not (isinstance(layers, int) and isinstance(width, int)):
        return None
    matmul = {
        id(p): p.numel()
        for m in model.modules()
        if not isinstance(m, nn.Embedding)
        for p in m.parameters(recurse=False)
    }
    lookup = {
        id(p): p.numel()
        for m in model.modules()
        if isinstance(m, nn.Embedding)
        for p in m.parameters(recurse=False)
        if id(p) not in matmul
    }
    n_params = sum(p.numel() for p in model.parameters()) - sum(lookup.values())
    return 6 * n_params + 12 * layers * width * cfg.block_size


# --- activation checkpointing (model.activation_checkpointing) -------------------------------------------------------

# Non-reentrant: gradients reach the adapters of a frozen LoRA base without a hook forcing the embeddings' output to
# require grad, keyword arguments are fine, and dropout's RNG state is replayed in the recompute.
CHECKPOINT_KWARGS = {"use_reentrant": False}


def enable_activation_checkpointing(model) -> None:
    """Each decoder layer recomputed in backward, in training only (transformers skips it in eval and under no_grad)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name; the old one warns it is deprecated
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=dict(CHECKPOINT_KWARGS))
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(CHECKPOINT_KWARGS))


def check_activation_checkpointing(cfg, model) -> None:
    """model.activation_checkpointing needs an architecture transformers can checkpoint (``model`` may be on meta)."""
    if cfg.activation_checkpointing and not getattr(model, "supports_gradient_checkpointing", False):
        raise RefusedValue(
            not_allowed(
                "model.activation_checkpointing",
                True,
                "false for this model, or an architecture that supports it (llama, gpt2, ...)",
                problem=f"is not supported by transformers' {type(model).__name__}",
            )
        )


def causal_lm_logits(model, batch):
    """The logits (B, T, vocabulary) of a text batch."""
    # packed rows carry position_ids and no attention_mask: transformers then keeps attention inside each example
    return model(
        input_ids=batch["input_ids"],
        attention_mask=batch.get("attention_mask"),
        position_ids=batch.get("position_ids"),
        use_cache=False,
    ).logits


def causal_lm_loss(model, batch):
    """Next-token cross entropy over the batch's pre-shifted labels (the loop's convention, so bits per byte and
    losses compare with the built-in GPT's), computed from the logits in fp32."""
    import torch.nn.functional as F

    logits = causal_lm_logits(model, batch)
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), batch["labels"].reshape(-1), ignore_index=IGNORE_INDEX
    )


def classification_loss(model, batch):
    return model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), labels=batch["labels"]).loss


def loss_function(cfg):
    return causal_lm_loss if cfg.hf.task == "causal_lm" else classification_loss


def adopt_tokenizer_ids(model, cfg) -> None:
    """The special ids the run's tokenizer really uses, in the model's config (and so in the export's config.json
    and generation_config.json). A model built from an architecture carries the architecture's defaults (Llama:
    end of sequence = 2, which is byte 0x02 to the byte tokenizer), so it takes the tokenizer's end of sequence
    (none for bytes: generation stops at max_new_tokens). Any model without a padding id takes the tokenizer's:
    a sequence classifier finds each row's last real token by it, and refuses batches of more than one row
    without it. A pretrained folder's own ids are kept."""
    from toolkit.data.tokenizers import load_tokenizer

    tokenizer = None
    if not cfg.model.hf.source:
        tokenizer = load_tokenizer(cfg)
        for config in (model.config, getattr(model, "generation_config", None)):
            if config is not None:
                config.eos_token_id, config.bos_token_id = tokenizer.eos_id, None
    if getattr(model.config, "pad_token_id", None) is None:
        pad = (tokenizer or load_tokenizer(cfg)).pad_id
        model.config.pad_token_id = pad
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.pad_token_id = pad
