"""Packing several examples into a row: where they go, what counts for the loss, and that a packed batch gives the
loss of the same examples one a row, through the loss functions training uses, for the built-in GPT and a
transformers Llama."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from toolkit import config
from toolkit.data.corpus import ExampleCorpus
from toolkit.data.token_files import TokenFiles
from toolkit.train.models import loss_function
from toolkit.train.models.gpt import GPT, packed_causal_mask

BLOCK = 24
LENGTHS = [7, 11, 5, 9, 14, 6, 25, 4]  # the 25-token example is cut to a row of 25 (block_size + 1)


def corpus(pad_id: int = 0, vocab: int = 256) -> ExampleCorpus:
    """Chat examples whose ids and masks are made here: odd positions count (an assistant's tokens, say)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, vocab, sum(LENGTHS)).astype(np.uint8 if vocab <= 256 else np.uint16)
    mask = np.concatenate([np.arange(n) % 2 for n in LENGTHS]).astype(np.uint8)
    starts = np.concatenate([[0], np.cumsum(LENGTHS)]).astype(np.int64)
    files = TokenFiles(None, tokens, starts, mask, None, {"bytes": len(tokens)})
    return ExampleCorpus("made", files, "0" * 64, BLOCK, 0.25, pad_id, np.ones(vocab, dtype=np.int64), mode="chat")


def test_examples_fill_rows_in_order_with_positions_restarting_and_no_label_across_two():
    c = corpus()
    ids, counted, positions, placed = c.packed_rows(range(len(LENGTHS)), rows=4)
    assert placed == [0, 1, 2, 3, 4, 5, 6, 7][: len(placed)]
    # row 0: 7 + 11 + 5 = 23 of 25 (9 more would not fit); row 1: 9 + 14; row 2: 6 (25 would not fit); row 3: 25
    assert positions[0].tolist() == [*range(7), *range(11), *range(5), 0, 0]
    assert positions[1].tolist() == [*range(9), *range(14), 0, 0]
    assert positions[2].tolist() == [*range(6), *[0] * 19] and positions[3].tolist() == list(range(25))
    assert placed == [0, 1, 2, 3, 4, 5, 6]
    row0 = c.tokens[: 7 + 11 + 5]
    assert ids[0, :23].tolist() == row0.tolist() and ids[0, 23:].tolist() == [0, 0]
    assert not counted[:, positions.shape[1] - 1][ids[:, -1] == 0].any()  # padding never counts
    # an example's first token never counts: it would be predicted from the example before
    assert not counted[positions == 0].any()


def test_the_packed_mask_keeps_attention_inside_each_example_and_causal():
    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0]])
    mask = packed_causal_mask(positions)[0, 0]
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 0, 1],
    ]


def batches(c: ExampleCorpus):
    """The same examples as one packed batch and as a batch of one example a row (padded, attention-masked)."""
    ids, counted, positions, placed = c.packed_rows(range(len(LENGTHS)), rows=3)
    labels = torch.where(counted[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    packed = {"input_ids": ids[:, :-1], "labels": labels, "position_ids": positions[:, :-1]}
    ids, counted, valid = c._rows(np.asarray(placed), BLOCK + 1)
    labels = torch.where(counted[:, 1:], ids[:, 1:], torch.full_like(ids[:, 1:], -100))
    one_a_row = {"input_ids": ids[:, :-1], "labels": labels, "attention_mask": valid[:, :-1].long()}
    assert (packed["labels"] != -100).sum() == (one_a_row["labels"] != -100).sum()  # the same tokens count
    return packed, one_a_row


@pytest.mark.parametrize("model_name", ["gpt", "hf-llama"])
def test_a_packed_batch_gives_the_loss_of_its_examples_one_a_row(model_name):
    torch.manual_seed(0)
    if model_name == "gpt":
        cfg = config.load("tiny", [f"model.block_size={BLOCK}"])
        model, c = GPT(cfg.model).eval(), corpus()
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = config.load("llama", [f"model.block_size={BLOCK}"])
        model = LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             max_position_embeddings=64, attn_implementation="sdpa")).eval()
        c = corpus(pad_id=0, vocab=300)
    with torch.no_grad():  # weights large enough that the context moves the logits, as trained weights do
        for p in model.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else None
    loss = loss_function(cfg.model)
    packed, one_a_row = batches(c)
    with torch.no_grad():
        assert torch.allclose(loss(model, packed), loss(model, one_a_row), rtol=1e-5, atol=1e-6)
        # and packing matters: the same rows read as one sequence each give another loss
        run_on = {"input_ids": packed["input_ids"], "labels": packed["labels"]}
        assert not torch.allclose(loss(model, run_on), loss(model, one_a_row), rtol=1e-3)
