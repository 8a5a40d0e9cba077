"""The batched KV cache (toolkit.deploy.serving.kv_cache) on small transformers models built from their configs (random
weights, nothing trained or downloaded): rows that join and leave one left-padded cache get the tokens and logits
they would get alone, which are transformers' own generate()'s."""

from __future__ import annotations

import pytest
import torch

from toolkit.deploy.serving.kv_cache import CachedDecoder, supports_batched_cache

SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 256}
PROMPTS = [list(b"def hello(x):"), list(b"ab"), list(b"The return value of the function is")]
NEW = 12
JOINS = {0: 0, 3: 1, 5: 2}  # step -> the prompt that joins then: later rows are shorter and longer than the first


def _model(architecture: str, **extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 256} \
        if architecture == "gpt2" else SIZES
    torch.manual_seed(0)
    config = AutoConfig.for_model(architecture, **sizes, **extra, bos_token_id=None, eos_token_id=None)
    return AutoModelForCausalLM.from_config(config).eval()


def _alone(model, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """transformers' greedy generate() of one prompt: its tokens and the logits that chose each."""
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences[0, len(prompt):].tolist(), [logits[0] for logits in out.logits]


@pytest.mark.parametrize("architecture", ["llama", "gpt2", "gpt_neox"])
def test_rows_joining_and_leaving_one_cache_generate_what_they_would_alone(architecture):
    model = _model(architecture)
    assert supports_batched_cache(model)
    decoder = CachedDecoder(model)
    tokens: dict[int, list[int]] = {}
    logits: dict[int, list[torch.Tensor]] = {}
    for step in range(NEW + max(JOINS)):
        live = [row for row in decoder.members if len(tokens[row]) < NEW]
        decoder.retain(live)  # rows that have their tokens leave
        if live:
            for row, row_logits in zip(live, decoder.step([tokens[row][-1] for row in live])):
                tokens[row].append(int(row_logits.argmax()))
                logits[row].append(row_logits)
        if step in JOINS:
            row = JOINS[step]
            first = decoder.join(row, PROMPTS[row])
            tokens[row], logits[row] = [int(first.argmax())], [first]
    for row, prompt in enumerate(PROMPTS):
        expected_tokens, expected_logits = _alone(model, prompt)
        assert tokens[row] == expected_tokens, row
        assert max(float((a - b).abs().max()) for a, b in zip(logits[row], expected_logits)) < 1e-4, row


def test_a_row_that_leaves_frees_its_place_and_the_others_go_on():
    model = _model("llama")
    decoder = CachedDecoder(model)
    first = [int(decoder.join("a", PROMPTS[2]).argmax())]
    short = [int(decoder.join("b", PROMPTS[1]).argmax())]
    decoder.retain(["b"])  # the long row leaves: the short one's left padding goes with it
    assert decoder.members == ["b"] and decoder.mask.shape == (1, len(PROMPTS[1])) and bool(decoder.mask.all())
    for _ in range(NEW - 1):
        short.append(int(decoder.step([short[-1]])[0].argmax()))
    assert short == _alone(model, PROMPTS[1])[0]
    decoder.retain([])
    assert len(decoder) == 0 and decoder.keys == []
    assert first  # the long row's first token came from its own prefill


def test_caches_that_cannot_be_padded_and_stacked_are_recognised():
    """A sliding-window model keeps only its window: its rows cannot share a left-padded cache (it then generates
    without one)."""
    assert not supports_batched_cache(_model("mistral", sliding_window=4))
