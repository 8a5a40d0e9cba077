"""How a generation ends and streams: stop strings cut the text (and are never streamed, even in part), a stop id
ends it as an end-of-sequence id does, half a character is held back, and top_p keeps the most probable tokens."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from toolkit.deploy.hf_folder import BytesTokenizer
from toolkit.deploy.serving.batcher import _Generate, _sample
from toolkit.deploy.serving.protocol import GenerateRequest


def job(stop=(), stop_ids=frozenset(), max_new_tokens=64):
    runtime = SimpleNamespace(block_size=128, tokenizer=BytesTokenizer())
    request = GenerateRequest(b"> ", max_new_tokens, 0.0, 0, None, stop=stop, stop_ids=stop_ids)
    generating = _Generate(request, runtime, None)
    generating.started = generating.submitted  # as the batcher marks a job it starts
    pieces = []
    generating.listener = pieces.append
    return generating, pieces


def feed(generating, data: bytes) -> None:
    """Make the greedy choice of each next token the next byte of ``data``, until the job is done."""
    for byte in data:
        if generating.done:
            return
        logits = np.zeros(256, dtype=np.float32)
        logits[byte] = 10.0
        generating.add(logits)


def test_a_stop_string_ends_the_text_before_it_and_no_part_of_it_is_streamed():
    generating, pieces = job(stop=("<|im_end|>",))
    feed(generating, "ok <|im_x <|im_end|> more".encode())
    result = generating.future.result(0)
    assert result["text"] == "ok <|im_x " and result["finish_reason"] == "stop"
    assert "".join(pieces) == "ok <|im_x "  # what may still become the stop string was held back, then dropped


def test_a_stop_id_ends_the_text_as_an_end_of_sequence_id_does():
    generating, pieces = job(stop_ids=frozenset([ord("!")]))
    feed(generating, b"Hi there! and on")
    result = generating.future.result(0)
    assert result["finish_reason"] == "stop" and result["new_tokens"] == len(b"Hi there!")


def test_max_new_tokens_ends_it_with_length_and_half_a_character_is_held_back():
    generating, pieces = job(max_new_tokens=4)
    feed(generating, "aé€".encode())  # a, then é's two bytes, then the first byte of €
    result = generating.future.result(0)
    assert result["finish_reason"] == "length" and result["new_tokens"] == 4
    assert pieces[:2] == ["a", "é"] and "".join(pieces) == result["text"]


def test_top_p_samples_only_from_the_most_probable_tokens_that_reach_it():
    probabilities = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probabilities)
    rng = np.random.default_rng(0)
    for top_p, allowed in ((0.4, {0}), (0.7, {0, 1}), (0.9, {0, 1, 2}), (1.0, {0, 1, 2, 3})):
        request = GenerateRequest(b"x", 1, 1.0, 0, None, top_p=top_p)
        drawn = {_sample(logits, request, rng) for _ in range(400)}
        assert drawn == allowed, (top_p, drawn)
