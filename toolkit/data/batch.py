"""What a batch is: the one contract between the data (toolkit.data.corpus makes batches) and the models
(toolkit.train.models turns them into a loss). A batch is a dict of tensors:

    text     input_ids (B, T) int64; labels (B, T) int64, the next token of each position (already shifted), or
             IGNORE_INDEX where no loss counts (a prompt in instruction tuning, padding); attention_mask (B, T)
             where some positions are padding; or position_ids (B, T) int64 instead of an attention_mask where a row
             packs several examples: positions count from 0 at each example's first token, and a token attends
             only to the tokens of its own example (a new example starts wherever the position is 0)
    tables   inputs (B, F) float32; labels (B,) int64
    labelled text (classification)   input_ids (B, T), attention_mask (B, T), labels (B,) int64
    preference pairs (train.objective=dpo)   a text batch twice, its keys prefixed: chosen_input_ids, chosen_labels,
             chosen_attention_mask, and rejected_...; row i of each holds one of the two answers to the same prompt,
             labels on the answer only
"""

from __future__ import annotations

IGNORE_INDEX = -100  # a label that counts for no loss (torch's cross_entropy and Hugging Face's convention)
INPUT_IDS, LABELS, ATTENTION_MASK, INPUTS = "input_ids", "labels", "attention_mask", "inputs"
POSITION_IDS = "position_ids"
CHOSEN, REJECTED = "chosen_", "rejected_"  # the prefixes of a preference batch's two halves
SAMPLE_IDS = "sample_ids"  # data.sampling=epochs: (B,) the rows' sample numbers; the trainer takes them out first


def half(batch: dict, prefix: str) -> dict:
    """One half of a preference batch (CHOSEN or REJECTED) as a text batch."""
    return {key.removeprefix(prefix): value for key, value in batch.items() if key.startswith(prefix)}
