"""toolkit.report.token_bits on real exports: the bits two models spend on each token of a text, against
transformers' own loss on the same ids; characters split over tokens; the HTML; refused folders and texts."""

from __future__ import annotations

import math
import re
import shutil

import pytest
import torch

from toolkit import load_config
from toolkit.deploy.export import write_model_folder
from toolkit.errors import RefusedValue
from toolkit.report.token_bits import token_bits, token_bits_html
from toolkit.train.models import build_model

TEXT = "def f(x):\n    return x < 1\n"
SIZES = ["model.hf.config.hidden_size=32", "model.hf.config.intermediate_size=64", "model.hf.config.num_hidden_layers=1",
         "model.hf.config.num_attention_heads=2", "model.hf.config.num_key_value_heads=2", "model.block_size=32",
         "model.hf.config.max_position_embeddings=32"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Two exports of a small random Llama over bytes (different seeds), written as `trainbook export` writes them."""
    root = tmp_path_factory.mktemp("exports")
    cfg = load_config("llama", SIZES)
    folders = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = build_model(cfg.model)
        provenance = {"run_dir": str(root), "checkpoint": "none", "step": 0, "engine": "torch", "zero_stage": 0,
                      "data": {}}
        folders.append(write_model_folder(model, cfg, root / f"seed{seed}", provenance).path)
    return folders


def test_each_token_costs_what_transformers_loss_says(exports):
    from transformers import AutoModelForCausalLM

    tokens = token_bits(*exports, TEXT)
    assert "".join(t.text for t in tokens) == TEXT and len(tokens) == len(TEXT.encode())  # one byte a token
    assert tokens[0].before is None and tokens[0].saved == 0.0
    ids = torch.tensor([list(TEXT.encode())])
    for folder, field in zip(exports, ("before", "after")):
        model = AutoModelForCausalLM.from_pretrained(folder).eval()
        with torch.no_grad():
            nats = model(input_ids=ids, labels=ids).loss.item()  # mean over the predicted tokens
        mean_bits = sum(getattr(t, field) for t in tokens[1:]) / (len(tokens) - 1)
        assert mean_bits == pytest.approx(nats / math.log(2), rel=1e-4)
    page = token_bits_html(tokens, "a", "b")
    assert page.count("rgba(0, 150, 60") - 1 == sum(t.saved > 0 for t in tokens)  # green where b saves (+ legend)
    assert page.count("rgba(210, 40, 40") - 1 == sum(t.saved < 0 for t in tokens)


def test_a_character_split_over_tokens_is_one_entry_and_bits_per_byte_counts_its_bytes(exports):
    text = "x = 'café→'\n"
    tokens = token_bits(*exports, text)
    assert [t.text for t in tokens] == list(text)  # é (2 bytes) and → (3 bytes) whole, never half a character
    assert all(t.after > 8 for t in tokens if t.text in "é→")  # a random model: ~8 bits a byte, 2 and 3 bytes here
    bpb = sum(t.after for t in tokens[1:]) / (len(text.encode()) - 1)
    page = token_bits_html(tokens, "a", "b")
    assert f"b {bpb:.3f}" in page.split("<pre")[0], (bpb, page[:300])


def test_the_same_model_twice_saves_nothing_and_the_html_escapes_text_and_labels(exports):
    tokens = token_bits(exports[0], exports[0], TEXT)
    assert all(t.saved == 0.0 for t in tokens)
    page = token_bits_html(tokens, "docs only", "after <LoRA>")
    assert ">&lt;</span>" in page and "&lt;LoRA&gt;" in page and "<LoRA>" not in page
    assert page.count("background:transparent") == len(tokens) - 1  # every predicted token unshaded
    before, after = re.findall(r"(\d+\.\d{3})", page.split("<pre")[0])[:2]
    assert before == after, page


def test_a_changed_or_missing_export_and_a_text_longer_than_the_context_are_refused(exports, tmp_path):
    with pytest.raises(RefusedValue, match=r"^text: 40 tokens is not a length both models read; allowed: 2 to 32"):
        token_bits(*exports, "x" * 40)
    changed = tmp_path / "changed"
    shutil.copytree(exports[0], changed)
    (changed / "config.json").write_text((changed / "config.json").read_text() + " ")
    with pytest.raises(RefusedValue, match=r"^before: .*config\.json"):
        token_bits(changed, exports[1], TEXT)
    with pytest.raises(RefusedValue, match=r"^after: "):
        token_bits(exports[0], tmp_path / "missing", TEXT)
