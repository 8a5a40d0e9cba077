"""A transformers model folder as export writes it and serving reads it: the model and its tokenizer loaded as
data (local files only, safetensors only, no code from the folder), and the model run on a batch of token ids.

    model = load_model(folder, "causal_lm")          # AutoModelForCausalLM.from_pretrained, safely
    tokenizer = load_tokenizer(folder, eos_ids(folder))   # encode(bytes) -> ids, decode(ids) -> str, eos_ids
    logits = model_logits(model, "causal_lm", ids)   # (batch, sequence, vocab); classifiers: (batch, labels)

Export uses it to check that the folder it wrote loads back to the same logits; the serving runtimes use it to
load what they serve (the tokenizer of the built-in GPT's exports too: AutoTokenizer loads every export's).
Which task names exist and which Auto class builds each is toolkit.train.models.hf's.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from toolkit import fsio
from toolkit.data.tokenizers import BYTES_KEY, ByteTokenizer
from toolkit.safe_load import HF_LOCAL_ONLY
from toolkit.catalogue.model_format import ExportError
from toolkit.errors import not_allowed

TOKENIZER_DESCRIPTION_MAX_BYTES = 64 * 1024


@contextlib.contextmanager
def quiet_progress():
    """Without transformers' progress bars (loading and writing weights): a kilobyte model drew two bars on stderr
    for every export and every server start. The setting is process-wide, so it is put back after."""
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def _plain(folder: str | Path) -> str:
    """``folder`` as transformers is given it, once none of its files is a link, a FIFO or a device: transformers
    opens several by name (and follows links), and a folder may come from elsewhere (toolkit.fsio)."""
    fsio.check_plain_folder(Path(folder), field="model", error=ExportError)
    return str(folder)


def load_model(folder: str | Path, task: str):
    """The folder's model in eval mode, float32, from its safetensors (never a pickled .bin)."""
    import torch
    import transformers

    from toolkit.train.models.hf import TASKS

    cls = getattr(transformers, TASKS[task])
    with quiet_progress():
        return cls.from_pretrained(_plain(folder), use_safetensors=True, dtype=torch.float32, **HF_LOCAL_ONLY).eval()


def context_length(config) -> int | None:
    """Positions the model can attend over (max_position_embeddings; GPT-2 names it n_positions), None if unbounded."""
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_logits(model, task: str, ids):
    """Logits of ``ids`` (int64, batch x sequence, rows unpadded): every position's next-token logits for a causal
    LM, one row of class logits per sequence for a classifier. transformers' decoder-only classifiers refuse a
    batch of more than one row when the model has no pad token; their rows then run one by one."""
    import torch

    if task == "causal_lm":
        return model(input_ids=ids, use_cache=False).logits
    if ids.shape[0] > 1 and getattr(model.config, "pad_token_id", None) is None:
        return torch.cat([model(input_ids=row[None]).logits for row in ids])
    return model(input_ids=ids).logits


def labels(folder: str | Path) -> list[str]:
    """A classifier's class names in id order (config.json's id2label)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(_plain(folder), **HF_LOCAL_ONLY)
    return [str(config.id2label[i]) for i in range(config.num_labels)]


def eos_ids(folder: str | Path) -> frozenset[int]:
    """The ids that end a generation, as transformers' generate() reads them: generation_config.json's
    eos_token_id when the folder has one, else config.json's."""
    from transformers import AutoConfig, GenerationConfig

    folder = Path(_plain(folder))
    if (folder / "generation_config.json").is_file():
        eos = GenerationConfig.from_pretrained(str(folder), **HF_LOCAL_ONLY).eos_token_id
    else:
        eos = getattr(AutoConfig.from_pretrained(str(folder), **HF_LOCAL_ONLY), "eos_token_id", None)
    return frozenset([] if eos is None else [eos] if isinstance(eos, int) else eos)


class BytesTokenizer(ByteTokenizer):
    """One id per UTF-8 byte, with the ids that end a generation."""

    name = "bytes"

    def __init__(self, eos: frozenset[int] = frozenset()):
        self.eos_ids = eos


class HFTokenizer:
    """The folder's own tokenizer through AutoTokenizer: text is encoded as ``tokenizer(text)`` does (special tokens
    included) and decoded without special tokens, as a plain transformers user would."""

    name = "transformers"

    def __init__(self, folder: Path, eos: frozenset[int]):
        from transformers import AutoTokenizer

        self.hf = AutoTokenizer.from_pretrained(str(folder), **HF_LOCAL_ONLY)
        self.eos_ids = eos

    def encode(self, text: bytes) -> list[int]:
        return list(self.hf(text.decode("utf-8"))["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)


def _describes_bytes(folder: Path) -> bool:
    """Is tokenizer.json Trainbook's description of the byte tokenizer (not a tokenizers file), as exports of the
    built-in GPT wrote it before the byte tokenizer saved transformers' files? Registered models keep them."""
    path = folder / "tokenizer.json"
    if (folder / "tokenizer_config.json").is_file() or not path.is_file():
        return False
    try:
        data = json.loads(
            fsio.read_regular_file(path, field="model", error=ExportError, limit=TOKENIZER_DESCRIPTION_MAX_BYTES)
        )
    except (ValueError, ExportError):  # a large or foreign file: a real tokenizer.json, for AutoTokenizer to read
        return False
    return isinstance(data, dict) and data.get("type") == BYTES_KEY


def load_tokenizer(folder: str | Path, eos: frozenset[int] = frozenset(), key: str | None = None):
    """The tokenizer an export was trained with, ready to encode prompts and decode generations; ``eos``: the ids
    that end a generation (:func:`eos_ids` for a transformers model; none for the built-in GPT, which never stops
    early); ``key``: the manifest's name for it. The byte tokenizer (its key, or the description older exports
    hold) is :class:`BytesTokenizer`: the same ids without importing transformers or its per-call cost."""
    folder = Path(_plain(folder))
    if key == BYTES_KEY or _describes_bytes(folder):
        return BytesTokenizer(eos)
    try:
        return HFTokenizer(folder, eos)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ExportError(
            not_allowed(
                "model",
                folder,
                "a folder with the files AutoTokenizer.from_pretrained loads",
                problem=f"has no tokenizer transformers can load ({str(exc)[:200]})",
            )
        ) from None
