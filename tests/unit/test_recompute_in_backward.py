"""Activation checkpointing (model.activation_checkpointing), in process on tiny models: each block is recomputed in
backward, in training only, with the very loss and gradients of a run without it (the built-in GPT, with dropout and
with LoRA; a Hugging Face Llama, with LoRA); the user's module through its own gradient_checkpointing_enable, or
refused naming the field. Runs through the CLI and both engines: tests/e2e/test_activation_checkpointing.py."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from toolkit import config as config_mod
from toolkit.train.models import custom, loss_function, prepare_model
from toolkit.train.models.preflight import ModelCheckError, check_model, pin_model

LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}
HF = ["model.name=hf", "model.hf.architecture=llama", f"model.hf.config={json.dumps(LLAMA)}"]
LAYERS = 2  # tiny.yaml's n_layer, and LLAMA's

USER_MODULE = textwrap.dedent('''
    import torch.nn as nn
    import torch.nn.functional as F

    class ByteModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, 16)
            self.head = nn.Linear(16, 256)
            self.asked = []

        def forward(self, input_ids, labels, attention_mask=None):
            return F.cross_entropy(self.head(self.emb(input_ids)).reshape(-1, 256), labels.reshape(-1))

    class TransformersStyle(ByteModel):
        def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
            self.asked.append(gradient_checkpointing_kwargs)

    class NoArguments(ByteModel):
        def gradient_checkpointing_enable(self):
            self.asked.append("called")

    def plain():
        return ByteModel()

    def transformers_style():
        return TransformersStyle()

    def no_arguments():
        return NoArguments()
    ''')


def load(*overrides: str) -> config_mod.Config:
    return config_mod.load("tiny", list(overrides))


def batch() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"input_ids": torch.randint(0, 256, (4, 32), generator=g),
            "labels": torch.randint(0, 256, (4, 32), generator=g)}


def mlp_forwards(model) -> list:
    """A list that grows by one as each forward of a block's MLP starts (a recompute stops once it has every tensor
    backward needs, before the MLP returns: a forward hook would miss it)."""
    calls = []
    for name, module in model.named_modules():
        if name.endswith("mlp"):
            module.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def train_step(*overrides: str) -> tuple[float, dict, int]:
    """One forward and backward of the model a run of ``overrides`` trains: its loss, the gradients of its
    trainable weights, and how many times the blocks' MLPs ran."""
    cfg = load(*overrides)
    model, _ = prepare_model(cfg)
    model.train()
    calls = mlp_forwards(model)
    torch.manual_seed(1)  # the same dropout masks on both sides
    loss = loss_function(cfg.model)(model, batch())
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}, len(calls)


@pytest.mark.parametrize("overrides", [
    pytest.param([], id="gpt"),
    pytest.param(["model.dropout=0.2"], id="gpt-dropout"),  # the recompute replays the forward's RNG state
    pytest.param(["model.lora.rank=4", "model.lora.target_modules=[qkv,mlp.0]"], id="gpt-lora"),
    pytest.param(HF, id="hf-llama"),
    pytest.param([*HF, "model.lora.rank=4"], id="hf-llama-lora"),
])
def test_each_block_is_recomputed_in_backward_with_the_same_loss_and_gradients(overrides):
    loss, grads, forwards = train_step(*overrides)
    loss_ac, grads_ac, forwards_ac = train_step(*overrides, "model.activation_checkpointing=true")
    assert (forwards, forwards_ac) == (LAYERS, 2 * LAYERS), "each block once in forward, once more in backward"
    assert loss_ac == loss
    assert grads_ac.keys() == grads.keys() and grads
    assert all(grads_ac[n] is not None for n in grads), "every trainable weight gets a gradient (LoRA: the adapters)"
    different = [n for n in grads if not torch.equal(grads_ac[n], grads[n])]
    assert not different, different


@pytest.mark.parametrize("overrides", [pytest.param([], id="gpt"), pytest.param(HF, id="hf-llama")])
def test_eval_and_no_grad_forwards_are_not_checkpointed(overrides):
    cfg = load(*overrides, "model.activation_checkpointing=true")
    model, _ = prepare_model(cfg)
    calls = mlp_forwards(model)
    with torch.no_grad():
        model.train()
        no_grad = loss_function(cfg.model)(model, batch())
        model.eval()
        evaluated = loss_function(cfg.model)(model, batch())
    assert len(calls) == 2 * LAYERS and not no_grad.requires_grad and evaluated.item() == no_grad.item()


# --- the user's own module -------------------------------------------------------------------------------------------

@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "acmodel.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("factory, asked", [("transformers_style", [{"use_reentrant": False}]),
                                            ("no_arguments", ["called"])])
def test_a_users_module_is_asked_through_its_own_gradient_checkpointing_enable(user_module, factory, asked):
    cfg = load("model.name=custom", f"model.factory=acmodel:{factory}", "model.activation_checkpointing=true")
    check_model(pin_model(cfg))
    model, _ = prepare_model(cfg)
    assert model.asked == asked
    assert prepare_model(load("model.name=custom", f"model.factory=acmodel:{factory}"))[0].asked == []


def test_a_users_module_without_gradient_checkpointing_enable_is_refused_naming_the_field(user_module):
    cfg = load("model.name=custom", "model.factory=acmodel:plain", "model.activation_checkpointing=true")
    with pytest.raises(ModelCheckError) as caught:
        check_model(pin_model(cfg))
    message = str(caught.value)
    assert message == ("model.activation_checkpointing: True needs the module to have gradient_checkpointing_enable(), "
                       "and ByteModel from acmodel:plain has none; allowed: false, or a module with a "
                       "gradient_checkpointing_enable() method (as transformers models have)"), message
    with pytest.raises(custom.ModelImportError, match="model.activation_checkpointing: True needs"):
        prepare_model(cfg)  # a run that got past the checks some other way still never trains without it
    check_model(pin_model(load("model.name=custom", "model.factory=acmodel:plain")))


def test_an_hf_architecture_transformers_cannot_checkpoint_is_refused_naming_the_field():
    gpt1 = ["model.name=hf", "model.hf.architecture=openai-gpt",
            'model.hf.config={"n_embd": 32, "n_layer": 1, "n_head": 2, "vocab_size": 256, "n_positions": 64}']
    check_model(pin_model(load(*gpt1)))
    with pytest.raises(ModelCheckError) as caught:
        check_model(pin_model(load(*gpt1, "model.activation_checkpointing=true")))
    assert str(caught.value).startswith("model.activation_checkpointing: True is not supported by transformers' "
                                        "OpenAIGPTLMHeadModel; allowed: false for this model"), str(caught.value)
