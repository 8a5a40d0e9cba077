"""What a fine-tune taught, token by token: the bits two exported models spend on each token of one text, and that
as HTML, each token shaded by the bits the second model saves over the first.

A model that spends b bits on a token gave it probability 2^-b given the text before it (b = -log2 p). Summed over a
text and divided by its bytes, that is the bits per byte the training cells report, so a sample shaded here is the
held-out figure made visible: green where fine-tuning made the text more expected (indentation, ``self.``, ``):``),
red where it made it less.

    tokens = token_bits(pretrained_folder, fine_tuned_folder, "def f(x):\\n    return x\\n")
    HTML(token_bits_html(tokens, "pretrained", "fine-tuned"))

Both folders are exports (``trainbook export``) of language models with the same tokenizer, loaded as an endpoint
loads them (toolkit.deploy.serving.runtimes: checked against their manifests, read as data, no code from them).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import RefusedValue, not_allowed, refused

SHADE_FULL_BITS = 4.0  # a token saving (or losing) this many bits or more is shaded at full strength


@dataclass(frozen=True)
class TokenBits:
    """One token of the text: as decoded alone, and the bits each model spent on it (None for the first token,
    which no model predicts: there is nothing before it)."""

    text: str
    before: float | None
    after: float | None

    @property
    def saved(self) -> float:
        """Bits the second model saves on this token (negative: it spends more)."""
        return 0.0 if self.before is None or self.after is None else self.before - self.after


def _runtime(field: str, folder: str | Path):
    """The export at ``folder`` as an endpoint loads it (every file checked against its manifest, safetensors only,
    no code from the folder: toolkit.deploy.serving.runtimes), refused naming ``field`` unless it models text."""
    from toolkit.deploy.serving.runtimes import load_runtime

    try:
        runtime = load_runtime(folder, "torch")
    except (OSError, ValueError) as exc:  # a missing folder or manifest, a changed file, a model no endpoint serves
        raise RefusedValue(f"{field}: {exc}") from None
    if "score" not in runtime.tasks:
        raise RefusedValue(not_allowed(field, str(folder), "an export of a language model", problem="is a classifier"))
    return runtime


def _bits(runtime, ids: list[int]) -> list[float]:
    """-log2 p(token i | tokens before i) for i = 1 .. len(ids) - 1."""
    import numpy as np

    from toolkit.deploy.serving.batcher import log_softmax

    log_probs = log_softmax(runtime.forward(np.asarray([ids], dtype=np.int64))[0, :-1].astype(np.float64))
    return (-log_probs[np.arange(len(ids) - 1), ids[1:]] / math.log(2)).tolist()


def _pieces(tokenizer, ids: list[int]) -> list[str]:
    """What each token adds to the decoded text. A character split over tokens is shown with the token that
    completes it (the tokens before it add ""), so the pieces join to the text and no piece holds half a character."""
    pieces, shown = [], ""
    for i in range(len(ids)):
        text = tokenizer.decode(ids[: i + 1])
        if text.endswith("\ufffd") and i < len(ids) - 1:
            pieces.append("")
            continue
        pieces.append(text[len(shown) :])
        shown = text
    return pieces


def token_bits(before: str | Path, after: str | Path, text: str) -> list[TokenBits]:
    """Each token of ``text`` with the bits the model in ``before`` and the one in ``after`` spend on it (a
    character split over tokens: one entry, the bits of its tokens summed)."""
    runtimes = {"before": _runtime("before", before), "after": _runtime("after", after)}
    ids = runtimes["after"].tokenizer.encode(text.encode("utf-8"))
    if runtimes["before"].tokenizer.encode(text.encode("utf-8")) != ids:
        raise RefusedValue(
            not_allowed(
                "before",
                str(before),
                f"an export with the same tokenizer as {after}",
                problem="splits the text into other tokens",
            )
        )
    limits = [r.block_size for r in runtimes.values() if r.block_size]
    limit = min(limits) if limits else None
    if len(ids) < 2 or (limit and len(ids) > limit):
        allowed = f"2 to {limit} tokens" if limit else "at least 2 tokens"
        raise RefusedValue(refused("text", f"{len(ids)} tokens is not a length both models read", allowed))
    spent = {field: [0.0] + _bits(r, ids) for field, r in runtimes.items()}
    tokens, held = [], [0.0, 0.0]
    for i, piece in enumerate(_pieces(runtimes["after"].tokenizer, ids)):
        held = [held[0] + spent["before"][i], held[1] + spent["after"][i]]
        if piece or i == len(ids) - 1:
            first = i == 0
            tokens.append(TokenBits(piece, None if first else held[0], None if first else held[1]))
            held = [0.0, 0.0]
    return tokens


def _shade(saved: float) -> str:
    if saved == 0:
        return "transparent"
    strength = min(abs(saved) / SHADE_FULL_BITS, 1.0) * 0.75
    rgb = "0, 150, 60" if saved > 0 else "210, 40, 40"
    return f"rgba({rgb}, {strength:.2f})"


def token_bits_html(tokens: list[TokenBits], before_label: str, after_label: str) -> str:
    """``tokens`` as the text they spell, each token shaded by the bits ``after_label`` saves over ``before_label``
    (hover for both figures), above one line with each model's bits per byte on the text."""
    predicted = [t for t in tokens if t.before is not None and t.after is not None]
    n_bytes = sum(len(t.text.encode("utf-8")) for t in predicted) or 1
    before_bpb = sum(t.before or 0.0 for t in predicted) / n_bytes
    after_bpb = sum(t.after or 0.0 for t in predicted) / n_bytes
    spans = []
    for t in tokens:
        if t.before is None or t.after is None:
            spans.append(f'<span title="the first token: nothing before it to predict it">{html.escape(t.text)}</span>')
            continue
        title = f"{before_label}: {t.before:.1f} bits, {after_label}: {t.after:.1f} bits"
        spans.append(
            f'<span style="background:{_shade(t.saved)}" title="{html.escape(title)}">{html.escape(t.text)}</span>'
        )
    legend = (
        f"bits per byte on this text: {html.escape(before_label)} {before_bpb:.3f}, "
        f"{html.escape(after_label)} {after_bpb:.3f}. "
        f'<span style="background:{_shade(SHADE_FULL_BITS)}">green</span>: {html.escape(after_label)} finds the token '
        f'more expected; <span style="background:{_shade(-SHADE_FULL_BITS)}">red</span>: less (full colour at '
        f"{SHADE_FULL_BITS:g} bits; hover a token for both figures)"
    )
    text = "".join(spans)
    return (
        f'<div class="trainbook-token-bits"><p>{legend}</p>'
        f'<pre style="line-height:1.5; padding:0.5em; border:1px solid #ccc">{text}</pre></div>'
    )
