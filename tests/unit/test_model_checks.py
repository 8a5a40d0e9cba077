"""The pre-launch checks of a user's model, pretrained weights and LoRA (toolkit.train.models.preflight), each bad
input refused with a message naming the field, the value and what is allowed; and the pieces they rest on: pinning
import paths, reading weights, fitting them, the adapters' state. Tiny models, no training, no subprocess (the CLI's
one-line error and the absent run directory: tests/e2e/test_user_models.py)."""

from __future__ import annotations

import dataclasses
import json
import textwrap

import pytest
import torch

from toolkit import config as config_mod
from toolkit.catalogue.pretrained import PretrainedError, open_weights, pin_init_from
from toolkit.train.models import build_model, custom, flops_per_item, hf, matmul_flops, prepare_model
from toolkit.train.models import preflight
from toolkit.train.models.preflight import ModelCheckError, check_model, pin_model

LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128}
LLAMA_SET = [f"model.hf.config={json.dumps(LLAMA)}", "model.name=hf", "model.hf.architecture=llama"]

USER_MODULE = textwrap.dedent('''
    import torch, torch.nn as nn, torch.nn.functional as F

    class ByteModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, 16)
            self.head = nn.Linear(16, 256)
            self.norm = nn.LayerNorm(16)

        def forward(self, input_ids, labels, attention_mask=None):
            logits = self.head(self.norm(self.emb(input_ids)))
            return F.cross_entropy(logits.reshape(-1, 256), labels.reshape(-1), ignore_index=-100)

    def build():
        return ByteModel()

    def gives_an_int():
        return 3

    def loses_nothing():
        class NoLoss(ByteModel):
            def forward(self, input_ids, labels, attention_mask=None):
                return {"logits": self.head(self.emb(input_ids))}
        return NoLoss()

    def nan_loss(model, batch):
        return torch.tensor(float("nan"))

    def whole_transformers_lm():
        from transformers import AutoConfig, AutoModelForCausalLM
        return AutoModelForCausalLM.from_config(AutoConfig.for_model(
            "llama", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=64))

    def crashes():
        class Crash(ByteModel):
            def forward(self, pixels):
                return pixels.sum()
        return Crash()
    ''')


def load(*overrides: str) -> config_mod.Config:
    return config_mod.load("tiny", list(overrides))


def refused(cfg) -> str:
    with pytest.raises(ModelCheckError) as caught:
        check_model(pin_model(cfg))
    message = str(caught.value)
    assert "\n" not in message and "allowed: " in message, message
    return message


@pytest.fixture
def user_module(tmp_path):
    """The folder holding usermodel.py (USER_MODULE), importable as 'usermodel' while the test runs."""
    (tmp_path / "usermodel.py").write_text(USER_MODULE)
    return tmp_path


def save_llama(folder, seed=0, **changes):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **{**LLAMA, **changes}))
    model.save_pretrained(folder)
    return model


# --- the user's own module ------------------------------------------------------------------------------------------

def test_a_transformers_causal_lm_from_a_factory_is_refused_its_labels_would_shift_twice(user_module, monkeypatch):
    monkeypatch.chdir(user_module)
    message = refused(load("model.name=custom", "model.factory=usermodel.py:whole_transformers_lm"))
    assert message.startswith("model.factory: ") and "returned a transformers LlamaForCausalLM" in message
    assert "model.name=hf" in message, message


def test_a_good_module_passes_and_a_relative_file_path_is_pinned_absolute(user_module, monkeypatch):
    monkeypatch.chdir(user_module)
    cfg = pin_model(load("model.name=custom", "model.factory=usermodel.py:build"))
    assert cfg.model.factory == f"{user_module / 'usermodel.py'}:build"
    check_model(cfg)


def test_a_module_path_of_the_users_code_pins_the_folder_it_imports_from(user_module, monkeypatch, tmp_path_factory):
    monkeypatch.chdir(user_module)
    monkeypatch.syspath_prepend(str(user_module))
    cfg = pin_model(load("model.name=custom", "model.factory=usermodel:build"))
    assert (cfg.model.factory, cfg.model.code_path) == ("usermodel:build", str(user_module))
    lineage = custom.code_lineage(cfg.model)
    assert lineage["factory"]["file"] == str(user_module / "usermodel.py")
    import hashlib

    assert lineage["factory"]["sha256"] == hashlib.sha256(USER_MODULE.encode()).hexdigest()
    # an installed package needs no folder: it imports anywhere
    assert pin_model(load("model.name=custom", "model.factory=json.decoder:JSONDecoder")).model.code_path == ""


@pytest.mark.parametrize("spec, words", [
    ("nosuchmodule:build", ["model.factory: 'nosuchmodule:build' does not import", "No module named"]),
    ("usermodel:nothing", ["has no attribute 'nothing'", "a name it defines: ByteModel, build"]),
    ("usermodel:gives_an_int", ["returned 'int'", "a function returning an nn.Module"]),
    ("usermodel:loses_nothing", ["model(**batch) returned dict, which holds no loss"]),
    ("usermodel:crashes", ["model.factory: model(**batch) raised TypeError", "input_ids [2, 32]"]),
    ("no-colon", ["is not an import path"]),
], ids=["no-import", "no-attribute", "not-a-module", "no-loss", "forward-raises", "not-a-path"])
def test_a_bad_import_path_or_forward_is_refused_naming_it(user_module, monkeypatch, spec, words):
    monkeypatch.syspath_prepend(str(user_module))
    message = refused(load("model.name=custom", f"model.factory={spec}"))
    assert all(w in message for w in words), message


def test_a_loss_adapter_that_gives_nan_is_refused(user_module, monkeypatch):
    monkeypatch.syspath_prepend(str(user_module))
    message = refused(load("model.name=custom", "model.factory=usermodel:build", "model.loss=usermodel:nan_loss"))
    assert message.startswith("model.loss: usermodel:nan_loss gave a loss of nan"), message


# --- Hugging Face architectures and folders -------------------------------------------------------------------------

def test_an_unknown_architecture_names_close_and_known_ones():
    message = refused(load(*LLAMA_SET, "model.hf.architecture=lama"))
    assert "model.hf.architecture: 'lama' is not a transformers architecture (close: llama" in message
    assert "such as llama, gpt2, gpt_neox" in message
    message = refused(load(*LLAMA_SET, "model.hf.architecture=vit"))
    assert "'vit' has no causal_lm model in transformers" in message


def test_a_config_transformers_cannot_build_is_refused_naming_the_field():
    message = refused(load(*LLAMA_SET, 'model.hf.config={"hidden_size": 60, "num_attention_heads": 7}'))
    assert message.startswith("model.hf.config: transformers cannot build it"), message


def test_an_hf_folder_without_config_or_weights_or_with_pickled_weights_is_refused(tmp_path):
    save_llama(tmp_path / "good")
    check_model(pin_model(load("model.name=hf", f"model.hf.source={tmp_path / 'good'}")))

    (tmp_path / "empty").mkdir()
    assert "has no config.json" in refused(load("model.name=hf", f"model.hf.source={tmp_path / 'empty'}"))
    (tmp_path / "nocfg").mkdir()
    (tmp_path / "good" / "model.safetensors").rename(tmp_path / "nocfg" / "model.safetensors")
    message = refused(load("model.name=hf", f"model.hf.source={tmp_path / 'good'}"))
    assert "holds no weights; allowed: model.safetensors, or shards listed in model.safetensors.index.json" in message
    torch.save({}, tmp_path / "good" / "pytorch_model.bin")
    message = refused(load("model.name=hf", f"model.hf.source={tmp_path / 'good'}"))
    assert "holds only pickled weights (pytorch_model.bin), which could run code when loaded" in message
    assert "is not a folder" in refused(load("model.name=hf", f"model.hf.source={tmp_path / 'absent'}"))


def test_a_sequence_longer_than_the_position_table_is_refused():
    message = refused(load(*LLAMA_SET, "model.block_size=256"))
    assert message == ("model.block_size: 256 is longer than the model's max_position_embeddings=128; "
                       "allowed: <= 128"), message


# --- LoRA -----------------------------------------------------------------------------------------------------------

def test_lora_targets_that_match_nothing_list_the_modules_that_exist():
    message = refused(load(*LLAMA_SET, "model.lora.rank=4", "model.lora.target_modules=q_prj"))
    assert "model.lora.target_modules: 'q_prj' matches no module of the model" in message
    assert "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj" in message
    message = refused(load("model.lora.rank=4", "model.lora.target_modules=ln1"))
    assert "'ln1' names LayerNorm modules, which LoRA cannot adapt" in message and "qkv, proj" in message
    check_model(pin_model(load(*LLAMA_SET, "model.lora.rank=4")))  # peft's default targets for llama


def test_lora_without_targets_on_a_model_peft_has_no_default_for_is_a_config_error():
    with pytest.raises(config_mod.ConfigError, match="model.lora.target_modules: is empty while model.lora.rank=4"):
        load("model.lora.rank=4")


def test_lora_trains_and_saves_only_the_adapters_and_they_load_back_over_a_rebuilt_base():
    from toolkit.train.engines.param_groups import adamw_param_groups, load_trainable_state, trainable_state

    cfg = load(*LLAMA_SET, "model.lora.rank=4")
    model, _ = prepare_model(cfg)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    assert {id(p) for g in adamw_param_groups(model, 0.1) for p in g["params"]} == \
        {id(p) for n, p in model.named_parameters() if n in trainable}
    state = trainable_state(model)
    assert set(state) == trainable
    with torch.no_grad():
        for p in state.values():
            p.add_(1.0)
    again, _ = prepare_model(cfg)  # the same seed: the same base and the same fresh adapters
    load_trainable_state(again, state, "here")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    with pytest.raises(RuntimeError, match="do not fit this model"):
        load_trainable_state(again, {"nonsense.weight": torch.zeros(1)}, "here")


# --- pretrained weights ---------------------------------------------------------------------------------------------

def test_weights_of_another_shape_name_the_first_tensor_and_both_shapes(tmp_path):
    save_llama(tmp_path / "narrow", hidden_size=32)
    message = refused(load(*LLAMA_SET, f"model.init_from={tmp_path / 'narrow'}"))
    assert ("its tensor model.embed_tokens.weight has shape [256, 32], this model's has [256, 64]") in message, message


def test_weights_with_fewer_or_more_layers_are_refused_naming_a_tensor(tmp_path):
    save_llama(tmp_path / "one", num_hidden_layers=1)
    assert "lacks 9 of this model's tensors, first model.layers.1." in refused(
        load(*LLAMA_SET, f"model.init_from={tmp_path / 'one'}"))
    save_llama(tmp_path / "three", num_hidden_layers=3)
    assert "holds 9 tensors this model does not have, first model.layers.2." in refused(
        load(*LLAMA_SET, f"model.init_from={tmp_path / 'three'}"))


def test_init_from_loads_the_folders_weights_whole_or_sharded_and_into_a_classifier(tmp_path):
    source = save_llama(tmp_path / "one")
    source.save_pretrained(tmp_path / "sharded", max_shard_size="50KB")
    assert len(open_weights(str(tmp_path / "sharded")).files) > 1
    for folder in ("one", "sharded"):
        cfg = pin_model(load(*LLAMA_SET, f"model.init_from={tmp_path / folder}"))
        check_model(cfg)
        model, origin = prepare_model(cfg)
        assert all(torch.equal(v, source.state_dict()[k]) for k, v in model.state_dict().items())
        assert origin["kind"] == "save_pretrained" and all(len(f["sha256"]) == 64 for f in origin["files"].values())
    # a classifier from a language model: the base's weights, a new head
    cfg = load(*LLAMA_SET, "model.hf.task=sequence_classification", "data.path=x.jsonl",
               f"model.init_from={tmp_path / 'one'}")
    check_model(cfg)
    model, _ = prepare_model(cfg)
    assert torch.equal(model.model.embed_tokens.weight, source.model.embed_tokens.weight)


def test_a_gpt_starts_from_an_export_style_file_with_its_tied_head_saved_once(tmp_path):
    from safetensors.torch import save_model

    cfg = load()
    torch.manual_seed(5)
    source = build_model(cfg.model)
    (tmp_path / "w").mkdir()
    save_model(source, str(tmp_path / "w" / "model.safetensors"))  # drops lm_head.weight, the tied duplicate
    cfg = pin_model(load(f"model.init_from={tmp_path / 'w'}"))
    check_model(cfg)
    model, _ = prepare_model(cfg)
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in model.state_dict().items())


def test_weights_that_are_links_or_a_name_nobody_registered_are_refused(tmp_path):
    save_llama(tmp_path / "real")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "model.safetensors").symlink_to(tmp_path / "real" / "model.safetensors")
    with pytest.raises(PretrainedError, match="holds model.safetensors, a symbolic link"):
        open_weights(str(tmp_path / "linked"))
    with pytest.raises(PretrainedError, match="'nobody:3' is not a folder, and as a model name is not registered"):
        pin_init_from("nobody:3")
    with pytest.raises(PretrainedError, match="'no/such/folder' is neither a folder nor a registered model"):
        pin_init_from("no/such/folder")


# --- the registry of checks and who pays for it ---------------------------------------------------------------------

def test_another_part_registers_a_check_and_built_in_models_skip_them_all(monkeypatch, tmp_path):
    monkeypatch.setattr(preflight, "CHECKS", list(preflight.CHECKS))
    seen = []

    @preflight.register_check
    def vocabulary_fits(cfg, model):
        seen.append(type(model).__name__)
        raise ModelCheckError("data.tokenizer: 'big' has 50,000 ids; allowed: at most the model's 256")

    check_model(load())  # the built-in gpt without init_from or LoRA: nothing is built, nothing runs
    assert seen == []
    assert "data.tokenizer" in refused(load(*LLAMA_SET))
    assert seen == ["LlamaForCausalLM"]


# --- MFU ------------------------------------------------------------------------------------------------------------

def test_hf_flops_follow_the_gpt_formula_when_the_config_names_layers_and_width():
    cfg = load(*LLAMA_SET)
    model = hf.build(cfg.model)
    flops, source = flops_per_item(model, cfg.model)
    embedding = model.model.embed_tokens.weight.numel()  # a lookup; the untied lm_head is a matmul
    n = sum(p.numel() for p in model.parameters()) - embedding
    assert (flops, source) == (6 * n + 12 * 2 * 64 * cfg.model.block_size, "the hf formula")

    class Bare(torch.nn.Module):
        config = None

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(4, 4)

    flops, source = flops_per_item(Bare(), dataclasses.replace(cfg.model, name="hf"))
    assert flops == matmul_flops(Bare()) and source.startswith("estimated as 6 x parameters")
