"""How text becomes token ids: the one owner of ``data.tokenizer``.

Every tokenizer offers the same few things, so the data pipeline, the pre-launch checks, export and serving never
ask which one they have:

    tok = load_tokenizer(cfg)       resolves data.tokenizer (bytes, the model folder's, a registered one, a folder)
    tok.key                         names it in cache file names: 'bytes-v1', or 'hf-' + the start of its sha256
    tok.sha256                      its content hash (what it does, not where its files are), pinned by a run
    tok.source                      where it came from, for messages and lineage
    tok.vocab_size, tok.eos_id      the ids it can produce; the document separator (None: bytes use SEPARATOR)
    tok.pad_id                      the id padded rows are filled with (masked out by attention_mask)
    tok.encode(text) -> list[int]   tok.decode(ids) -> str          (no special tokens added: add_special_tokens=False)
    tok.encode_with_offsets(text)   (ids, the character each token starts at): what a chat's loss mask is cut by
    tok.save(folder)                files that ``transformers.AutoTokenizer.from_pretrained(folder)`` loads and that
                                    encode and decode exactly as ``tok`` does (the byte tokenizer included)
    tok.byte_lengths()              UTF-8 bytes each id stands for (special tokens: 0), for bits per byte

Where a tokenizer comes from (``data.tokenizer``): 'bytes'; 'model' (the tokenizer saved in model.hf.source);
a folder holding tokenizer.json; a registered tokenizer 'name[:version]'; 'auto' (the model folder's when it has
one, else bytes). A registered tokenizer is a ``uri_folder`` data asset tagged ``kind=tokenizer`` (an Azure ML
Data asset too): content-hashed, versioned and snapshotted like any data, with no table of its own.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from toolkit.errors import UserError, not_allowed, refused
from toolkit.fsio import check_plain_folder
from toolkit.safe_load import HF_LOCAL_ONLY

BYTES_KEY = "bytes-v1"
# The byte tokenizer's content hash as transformers saves and loads it (HFTokenizer(ByteTokenizer().hf()).sha256),
# written out so a byte-level run never imports `tokenizers` (tests/unit/test_tokenizers.py checks it). Lineage
# only: 'bytes' itself is the pin (BYTES_KEY never changes meaning), so a `tokenizers` release that describes the
# same tokenizer differently changes this line, never whether a byte-level run resumes.
BYTES_SHA256 = "61f51ceed0ab5cd73e3f2b90154fcb30fc98c0dc92f8213efabbfca93e31bdf1"
KIND_TAG = ("kind", "tokenizer")  # the tag that makes a registered uri_folder a tokenizer


def is_tokenizer(asset) -> bool:
    """Is this registered data asset a tokenizer (trained here), not data?"""
    return asset.tags.get(KIND_TAG[0]) == KIND_TAG[1]


TOKENIZER_FILE = "tokenizer.json"
ALLOWED = (
    "'bytes', 'auto', 'model' (the tokenizer in model.hf.source), a folder holding tokenizer.json, or a "
    "registered tokenizer 'name[:version]' (`trainbook data tokenizer train`)"
)


class TokenizerError(UserError, ValueError):
    """A data.tokenizer that cannot be used; the message names it and what is allowed."""


def _content_hash(backend, eos: str | None, pad: str | None) -> str:
    """What a tokenizer does, as a hash: its `tokenizers` description and the special tokens this pipeline uses,
    the same wherever its files are (a registered snapshot, a model folder, an export)."""
    described = json.dumps({"tokenizer": json.loads(backend.to_str()), "eos": eos, "pad": pad}, sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()


def byte_to_char() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (what `tokenizers`' ByteLevel uses)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def _byte_level_backend():
    """A `tokenizers` tokenizer whose id for each byte is the byte's value: BPE over the byte-level alphabet with
    no merges and no pre-splitting, so a text's ids are its UTF-8 bytes, and decoding turns ids back into bytes
    (invalid UTF-8 replaced as Python's errors='replace' does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    backend = Tokenizer(models.BPE(vocab={c: b for b, c in byte_to_char().items()}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return backend


class ByteTokenizer:
    """One id per UTF-8 byte (vocabulary 256): nothing to train, ship or download."""

    key = BYTES_KEY
    sha256 = BYTES_SHA256
    source = "bytes"
    vocab_size = 256
    eos_id = None  # documents are joined by toolkit.data.documents.SEPARATOR instead
    pad_id = 0  # NUL: never in text, and masked out anyway

    def encode(self, text: str | bytes) -> list[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else text)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        ids = list(text.encode("utf-8"))
        starts = [i for i, ch in enumerate(text) for _ in range(len(ch.encode("utf-8")))]
        return ids, starts

    def byte_lengths(self) -> np.ndarray:
        return np.ones(256, dtype=np.int64)

    def hf(self):
        """The same tokenizer as a transformers tokenizer (what :meth:`save` writes)."""
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=_byte_level_backend(), clean_up_tokenization_spaces=False)

    def save(self, folder: Path) -> None:
        self.hf().save_pretrained(str(folder))

    def identity(self) -> dict:
        return {"key": self.key, "sha256": self.sha256, "source": self.source, "vocab_size": self.vocab_size}


class HFTokenizer:
    """A Hugging Face fast tokenizer (one trained here, a model's own, or any folder holding tokenizer.json)."""

    def __init__(self, hf, source: str):
        from tokenizers import Tokenizer

        self.hf, self.source = hf, source
        # The pipeline encodes with the backend directly (in Rust, in parallel), never truncating or padding.
        self._backend = Tokenizer.from_str(hf.backend_tokenizer.to_str())
        self._backend.no_truncation()
        self._backend.no_padding()
        self.sha256 = _content_hash(hf.backend_tokenizer, hf.eos_token, hf.pad_token)
        self.key = "hf-" + self.sha256[:16]
        self.vocab_size = max(len(hf), max(hf.get_vocab().values(), default=-1) + 1)
        self.eos_id = hf.eos_token_id
        self.pad_id = hf.pad_token_id if hf.pad_token_id is not None else self.eos_id if self.eos_id is not None else 0

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._backend.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids])

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[int]]:
        encoding = self._backend.encode(text, add_special_tokens=False)
        return encoding.ids, [start for start, _ in encoding.offsets]

    def save(self, folder: Path) -> None:
        self.hf.save_pretrained(str(folder))

    def byte_lengths(self) -> np.ndarray:
        """UTF-8 bytes per id: exact for byte-level tokenizers (each token is a fixed byte string); for others
        (SentencePiece '▁' words, '<0x0A>' byte fallbacks, WordPiece '##' pieces) read from the token's text,
        which counts the space a SentencePiece tokenizer puts before each document's first word."""
        tokens = self.hf.convert_ids_to_tokens(list(range(self.vocab_size)))
        special = set(self.hf.all_special_ids) | {i for i, t in self.hf.added_tokens_decoder.items() if t.special}
        to_byte = {c: b for b, c in byte_to_char().items()} if _is_byte_level(self._backend) else None
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        for i, token in enumerate(tokens):
            if token is None or i in special:
                continue
            if to_byte is not None and all(c in to_byte for c in token):
                lengths[i] = len(token)
            elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
                lengths[i] = 1
            else:
                lengths[i] = len(token.replace("▁", " ").removeprefix("##").encode())
        return lengths

    def identity(self) -> dict:
        return {"key": self.key, "sha256": self.sha256, "source": self.source, "vocab_size": self.vocab_size}


def _is_byte_level(backend) -> bool:
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return any(part.get("type") == "ByteLevel" for part in parts)


def _from_folder(folder: Path, source: str, field: str, value) -> HFTokenizer:
    """The tokenizer saved in ``folder``: local files only, no code from the folder (trust_remote_code False), and
    none of its files a link or a FIFO (AutoTokenizer opens several by name)."""
    from transformers import AutoTokenizer

    check_plain_folder(folder, field=field, error=TokenizerError)
    try:
        hf = AutoTokenizer.from_pretrained(str(folder), **HF_LOCAL_ONLY)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TokenizerError(
            not_allowed(
                field,
                value,
                ALLOWED,
                problem=f"does not load as a tokenizer from {str(folder)!r} ({type(exc).__name__}: {exc})",
            )
        ) from None
    if not getattr(hf, "is_fast", False) or not hasattr(hf, "backend_tokenizer"):
        raise TokenizerError(
            not_allowed(
                field,
                value,
                "a fast tokenizer (tokenizer.json)",
                problem=f"is a {type(hf).__name__}, which has no tokenizer.json",
            )
        )
    return HFTokenizer(hf, source)


def model_tokenizer_folder(cfg) -> Path | None:
    """The folder a model brings its tokenizer in: model.hf.source, else model.init_from (a folder, or a registered
    model's snapshot), when it holds tokenizer.json; None otherwise."""
    candidates = [Path(cfg.model.hf.source).expanduser()] if cfg.model.name == "hf" and cfg.model.hf.source else []
    if cfg.model.init_from:
        candidates.append(_init_from_folder(cfg))
    return next((c for c in candidates if c is not None and (c / TOKENIZER_FILE).is_file()), None)


def _init_from_folder(cfg) -> Path | None:
    """model.init_from as a folder: itself, or the snapshot of the registered model NAME[:VERSION] it names (None
    when it is neither: the model's own pre-launch checks refuse it)."""
    from toolkit import names

    folder = Path(cfg.model.init_from).expanduser()
    if folder.is_dir() or names.split_ref(cfg.model.init_from) is None:
        return folder
    from toolkit.catalogue.model_registry import DataAssetError, get_model

    try:
        return get_model(_workspace(cfg), cfg.model.init_from).path
    except DataAssetError:
        return None


def _workspace(cfg):
    from toolkit.catalogue.workspace import Workspace

    return Workspace.open(cfg.data.workspace or None)


def registered_tokenizer(ws, ref: str):
    """The registered tokenizer ``ref`` (a data asset tagged kind=tokenizer), ready to read."""
    from toolkit.catalogue import data_assets

    try:
        asset = data_assets.open_asset(ws, ref)
    except data_assets.DataAssetError as exc:
        raise TokenizerError(f"data.tokenizer: {exc}") from None
    if not is_tokenizer(asset):
        raise TokenizerError(
            not_allowed(
                "data.tokenizer", ref, ALLOWED, problem=f"is a registered {asset.type} data asset, not a tokenizer"
            )
        )
    return asset


def _is_folder(value: str) -> bool:
    """A data.tokenizer value that names a folder: a path (with '/', or starting '.' or '~'), or an existing folder."""
    return "/" in value or value.startswith((".", "~")) or Path(value).expanduser().is_dir()


def registered(value: str) -> bool:
    """Whether a data.tokenizer value names a registered tokenizer (not a keyword, not a folder)."""
    return value not in ("auto", "bytes", "model") and not _is_folder(value)


def resolve(cfg) -> tuple[str, object]:
    """(the data.tokenizer value to pin, the tokenizer): 'auto' becomes what it chose ('bytes', 'model' or the
    init_from folder), a registered 'name' becomes 'name:version'. Files holding the byte tokenizer (a byte-level
    model's export, say) are the byte tokenizer: 'bytes', with its fast path and its token files."""
    value, tokenizer = _resolve(cfg)
    if tokenizer.sha256 == BYTES_SHA256:
        return "bytes", ByteTokenizer()
    return value, tokenizer


def _resolve(cfg) -> tuple[str, object]:
    from toolkit import names

    value = cfg.data.tokenizer
    if value == "auto":
        folder = model_tokenizer_folder(cfg)
        if folder is None:
            return "bytes", ByteTokenizer()
        value = (
            "model"
            if cfg.model.name == "hf" and folder == Path(cfg.model.hf.source).expanduser()
            else str(folder.resolve())
        )
    if value == "bytes":
        return value, ByteTokenizer()
    if value == "model":
        if cfg.model.name != "hf" or not cfg.model.hf.source:
            raise TokenizerError(
                refused(
                    "data.tokenizer",
                    f"is 'model' while model.hf.source is empty (model.name={cfg.model.name!r})",
                    ALLOWED,
                )
            )
        return value, _from_folder(
            Path(cfg.model.hf.source).expanduser(), f"the model's ({cfg.model.hf.source})", "data.tokenizer", value
        )
    folder = Path(value).expanduser()
    if _is_folder(value):
        if not (folder / TOKENIZER_FILE).is_file():
            raise TokenizerError(
                not_allowed("data.tokenizer", value, ALLOWED, problem="is not a folder holding tokenizer.json")
            )
        return value, _from_folder(folder, f"folder {value}", "data.tokenizer", value)
    if names.split_ref(value) is None:
        raise TokenizerError(not_allowed("data.tokenizer", value, ALLOWED))
    asset = registered_tokenizer(_workspace(cfg), value)
    return asset.ref, _from_folder(asset.path, f"registered {asset.ref}", "data.tokenizer", value)


def load_tokenizer(cfg):
    """The tokenizer ``cfg.data.tokenizer`` names ('auto': the model's own when it has one, else bytes). A run's
    config pins its content hash (data.tokenizer_sha256) at launch: any other tokenizer is refused, so a resume, an
    export or a second node tokenizes exactly as the run began."""
    _, tokenizer = resolve(cfg)
    pinned = cfg.data.tokenizer_sha256
    if pinned and pinned != tokenizer.sha256:
        raise TokenizerError(
            not_allowed(
                "data.tokenizer",
                cfg.data.tokenizer,
                f"the tokenizer the run was started with (sha256 {pinned})",
                problem=f"is now {tokenizer.source} with sha256 {tokenizer.sha256}: its files changed since the run "
                "started",
            )
        )
    return tokenizer


def pin_tokenizer(cfg) -> tuple[str, str]:
    """(data.tokenizer, data.tokenizer_sha256) as a run records them: the exact choice and its content hash
    ('bytes' needs none: it always means the same ids)."""
    value, tokenizer = resolve(cfg)
    return value, "" if value == "bytes" else tokenizer.sha256


def check_tokenizer_fits(cfg, model) -> None:
    """Refuse, before launch, a tokenizer with ids the model's input embedding has no row for (naming both sizes).
    ``model`` is the built model (an HF model, a peft wrapper, the built-in GPT, or a user's module with
    get_input_embeddings); a model without a token embedding (a table model) has nothing to check."""
    try:
        embedding = (
            model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else getattr(model, "wte", None)
        )
    except NotImplementedError:  # a transformers model class that does not say which module it is
        embedding = None
    weight = getattr(embedding, "weight", None)
    if weight is None:
        return
    tokenizer = load_tokenizer(cfg)
    rows = int(weight.shape[0])
    if tokenizer.vocab_size > rows:
        raise TokenizerError(
            not_allowed(
                "data.tokenizer",
                cfg.data.tokenizer,
                f"a tokenizer of at most {rows} ids (the model's input embedding "
                "has that many rows), or a model built for this tokenizer",
                problem=f"({tokenizer.source}) has {tokenizer.vocab_size} ids but the model's input embedding has "
                f"{rows} rows",
            )
        )
