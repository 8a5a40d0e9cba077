"""toolkit.report.token_bits: the bits two exported models spend on each token of a text, against transformers'
own loss on the same ids, and their HTML."""

from __future__ import annotations

import math
import re

import pytest
import torch

from toolkit.data.tokenizers import ByteTokenizer
from toolkit.errors import RefusedValue
from toolkit.report.token_bits import token_bits, token_bits_html

TEXT = "def f(x):\n    return x < 1\n"


def llama_folder(path, seed: int, positions: int = 64):
    """A small random Llama over bytes, saved as an export is (safetensors, the byte tokenizer's files)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=positions)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    ByteTokenizer().save(path)
    return path, model.eval()


def test_each_token_costs_what_transformers_loss_says(tmp_path):
    before, model_before = llama_folder(tmp_path / "a", 0)
    after, model_after = llama_folder(tmp_path / "b", 1)
    tokens = token_bits(before, after, TEXT)
    assert "".join(t.text for t in tokens) == TEXT
    assert tokens[0].before is None and tokens[0].saved == 0.0
    ids = torch.tensor([list(TEXT.encode())])
    for model, field in ((model_before, "before"), (model_after, "after")):
        with torch.no_grad():
            nats = model(input_ids=ids, labels=ids).loss.item()  # mean over the predicted tokens
        mean_bits = sum(getattr(t, field) for t in tokens[1:]) / (len(tokens) - 1)
        assert mean_bits == pytest.approx(nats / math.log(2), rel=1e-5)
    assert all(t.saved == pytest.approx(t.before - t.after) for t in tokens[1:])
    page = token_bits_html(tokens, "a", "b")
    assert page.count("rgba(0, 150, 60") - 1 == sum(t.saved > 0 for t in tokens)  # green where b saves (+ legend)
    assert page.count("rgba(210, 40, 40") - 1 == sum(t.saved < 0 for t in tokens)


def test_the_same_model_twice_saves_nothing_and_the_html_says_so(tmp_path):
    folder, _ = llama_folder(tmp_path / "a", 0)
    tokens = token_bits(folder, folder, TEXT)
    assert all(t.saved == 0.0 for t in tokens)
    page = token_bits_html(tokens, "docs only", "after <LoRA>")
    assert ">&lt;</span>" in page and "&lt;LoRA&gt;" in page and "<LoRA>" not in page
    assert page.count("background:transparent") == len(tokens) - 1  # every predicted token unshaded
    bpb = re.findall(r"(\d+\.\d\d)", page.split("<pre")[0])
    assert bpb[0] == bpb[1], page


def test_a_text_longer_than_the_context_or_another_tokenizer_is_refused(tmp_path):
    before, _ = llama_folder(tmp_path / "a", 0, positions=8)
    after, _ = llama_folder(tmp_path / "b", 1, positions=8)
    with pytest.raises(RefusedValue, match=r"^text: 27 tokens is not a length both models read; allowed: 2 to 8"):
        token_bits(before, after, TEXT)
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "def": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    other = tmp_path / "c"
    llama_folder(other, 2)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (other / name).unlink(missing_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(other)
    with pytest.raises(RefusedValue, match=r"^before: .* splits the text into other tokens; allowed: an export"):
        token_bits(other, after, "def x")
