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
"""

from __future__ import annotations

from toolkit.data.batch import IGNORE_INDEX

TASKS = {"causal_lm": "AutoModelForCausalLM", "sequence_classification": "AutoModelForSequenceClassification"}


def auto_class(cfg):
    import transformers

    return getattr(transformers, TASKS[cfg.hf.task])


def hf_config(cfg):
    """The transformers config the model is built from (read from the folder, or made from the architecture)."""
    from transformers import AutoConfig

    if cfg.hf.source:
        config = AutoConfig.from_pretrained(cfg.hf.source)
    else:
        config = AutoConfig.for_model(cfg.hf.architecture, **cfg.hf.config)
    if cfg.hf.task == "sequence_classification":
        config.num_labels = cfg.hf.num_labels
    return config


def build(cfg):
    """The model: the folder's weights with hf.source, else fresh weights (seeded by the caller's torch seed)."""
    cls = auto_class(cfg)
    config = hf_config(cfg)
    if cfg.hf.source:
        return cls.from_pretrained(cfg.hf.source, config=config)
    return cls.from_config(config)


def causal_lm_loss(model, batch):
    """Next-token cross entropy over the batch's pre-shifted labels (the loop's convention, so bits per byte and
    losses compare with the built-in GPT's), computed from the logits in fp32."""
    import torch.nn.functional as F

    out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"), use_cache=False)
    logits = out.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), batch["labels"].reshape(-1),
                           ignore_index=IGNORE_INDEX)


def classification_loss(model, batch):
    return model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                 labels=batch["labels"]).loss


def loss_function(cfg):
    return causal_lm_loss if cfg.hf.task == "causal_lm" else classification_loss
