"""Train a byte-level BPE tokenizer on a registered text asset and register it in the workspace
(``trainbook data tokenizer train ASSET --vocab N``).

The tokenizer is GPT-2's kind: every byte is in its alphabet (any text encodes, nothing is unknown), words are split
by GPT-2's pattern, and merges are learnt from the asset's documents (a .jsonl file's text field, or prompt and
completion). It is saved as a transformers tokenizer folder (``AutoTokenizer.from_pretrained`` loads it) with an
end-of-text token, and registered as a ``uri_folder`` data asset tagged ``kind=tokenizer``, so it is content-hashed
and versioned like data: training the same asset again gives the same version.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from toolkit.data.documents import DataFormat
from toolkit.data.tokenizers import KIND_TAG, TokenizerError, is_tokenizer
from toolkit.errors import not_allowed, refused

EOS_TOKEN = "<|endoftext|>"
MIN_VOCAB = 257  # the 256 bytes and the end-of-text token
MAX_VOCAB = 262_144


def check_vocab(vocab_size) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        allowed = f"an integer from {MIN_VOCAB} (the 256 bytes and {EOS_TOKEN}) to {MAX_VOCAB:,}"
        raise TokenizerError(not_allowed("--vocab", vocab_size, allowed, problem="is out of range"))
    return vocab_size


def train_bpe(texts, vocab_size: int, progress: bool = False):
    """A byte-level BPE tokenizer with up to ``vocab_size`` ids (fewer when the texts hold fewer merges), trained
    on the strings ``texts`` yields, as a transformers fast tokenizer with EOS_TOKEN as its id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=check_vocab(vocab_size),
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS_TOKEN, clean_up_tokenization_spaces=False)


def _texts(batches, fmt: DataFormat, bar):
    from toolkit.data.token_files import pieces_of, record_text

    text_of = record_text(fmt)
    for records, size, _ in batches:
        for record in records:
            text = text_of(record)
            yield from pieces_of(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)
        bar.update(size)


def train_tokenizer(
    ws,
    asset_ref: str,
    vocab_size: int,
    name: str | None = None,
    text_field: str = "text",
    prompt_field: str = "",
    completion_field: str = "",
    progress: bool = True,
):
    """Train a byte-level BPE tokenizer on the text asset ``asset_ref`` and register it as ``name`` (default
    ASSET-bpeVOCAB); returns the registered data asset (``.ref`` is what data.tokenizer takes)."""
    from tqdm import tqdm

    from toolkit.catalogue import data_assets
    from toolkit.data.sources import asset_source

    check_vocab(vocab_size)
    if bool(prompt_field) != bool(completion_field):
        raise TokenizerError(refused("--prompt-field", "and --completion-field come together", "both or neither"))
    asset = data_assets.open_asset(ws, asset_ref)  # an unknown asset is refused here, naming the versions there are
    if is_tokenizer(asset) or asset.type == "mltable":
        kind = "a tokenizer" if asset.type != "mltable" else "a table (mltable)"
        raise TokenizerError(
            refused("asset", f"{asset.ref} is {kind}", "a uri_file or uri_folder asset of text or JSON Lines")
        )
    name = name or f"{asset.name}-bpe{vocab_size}"
    _check_name_is_free(ws, name)
    fmt = (
        DataFormat("instruction", prompt_field=prompt_field, completion_field=completion_field)
        if prompt_field
        else DataFormat("text", text_field=text_field)
    )
    with tqdm(
        total=asset.size_bytes,
        unit="B",
        unit_scale=True,
        desc=f"reading {asset.ref}",
        delay=2.0,
        disable=not progress,
        leave=False,
    ) as bar:
        tokenizer = train_bpe(_texts(asset_source(asset, asset.ref).batches(fmt), fmt, bar), vocab_size, progress)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return data_assets.register(
            ws,
            name,
            Path(tmp),
            type="uri_folder",
            tags={
                KIND_TAG[0]: KIND_TAG[1],
                "algorithm": "byte-level BPE",
                "vocab_size": str(len(tokenizer)),
                "trained_on": asset.ref,
                "trained_on_sha256": asset.sha256,
            },
            description=f"byte-level BPE tokenizer ({len(tokenizer)} ids) trained on {asset.ref}",
        )


def _check_name_is_free(ws, name: str) -> None:
    """A tokenizer's versions are tokenizers: a name that data already has is refused."""
    from toolkit.catalogue import data_assets
    from toolkit.names import check_name

    check_name(name, "--name", TokenizerError)
    taken = [a for a in data_assets.list_assets(ws, name=name, include_archived=True) if not is_tokenizer(a)]
    if taken:
        raise TokenizerError(
            not_allowed("--name", name, "a name no data asset has", problem=f"is the name of data asset {taken[0].ref}")
        )
