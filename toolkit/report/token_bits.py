"""What a fine-tune taught, token by token: the bits two exported models spend on each token of one text, and that
as HTML, each token shaded by the bits the second model saves over the first.

A model that spends b bits on a token gave it probability 2^-b given the text before it (b = -log2 p). Summed over a
text and divided by its bytes, that is the bits per byte the training cells report, so a sample shaded here is the
held-out figure made visible: green where fine-tuning made the text more expected (indentation, ``self.``, ``):``),
red where it made it less.

    tokens = token_bits(pretrained_folder, fine_tuned_folder, "def f(x):\\n    return x\\n")
    HTML(token_bits_html(tokens, "pretrained", "fine-tuned"))

Both folders are exports (``trainbook export``) with the same tokenizer; they are read as data (safetensors, no code
from the folder: toolkit.deploy.hf_folder).
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


def _bits(model, ids: list[int]) -> list[float]:
    """-log2 p(token i | tokens before i) for i = 1 .. len(ids) - 1."""
    import torch

    from toolkit.deploy.hf_folder import model_logits

    with torch.no_grad():
        logits = model_logits(model, "causal_lm", torch.tensor([ids]))[0, :-1].float()
    chosen = logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return (-chosen / math.log(2)).tolist()


def token_bits(before: str | Path, after: str | Path, text: str) -> list[TokenBits]:
    """Each token of ``text`` with the bits the model in ``before`` and the one in ``after`` spend on it."""
    from toolkit.deploy.hf_folder import context_length, load_model, load_tokenizer

    tokenizer = load_tokenizer(after)
    ids = tokenizer.encode(text.encode("utf-8"))
    if load_tokenizer(before).encode(text.encode("utf-8")) != ids:
        raise RefusedValue(
            not_allowed(
                "before",
                str(before),
                f"an export with the same tokenizer as {after}",
                problem="splits the text into other tokens",
            )
        )
    models = [load_model(folder, "causal_lm") for folder in (before, after)]
    limit = min(filter(None, (context_length(m.config) for m in models)), default=None)
    if len(ids) < 2 or (limit and len(ids) > limit):
        allowed = f"2 to {limit} tokens" if limit else "at least 2 tokens"
        raise RefusedValue(refused("text", f"{len(ids)} tokens is not a length both models read", allowed))
    spent = [_bits(m, ids) for m in models]
    first = TokenBits(tokenizer.decode(ids[:1]), None, None)
    return [first] + [TokenBits(tokenizer.decode([i]), b, a) for i, b, a in zip(ids[1:], *spent)]


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
        f"bits per byte on this text: {html.escape(before_label)} {before_bpb:.2f}, "
        f"{html.escape(after_label)} {after_bpb:.2f}. "
        f'<span style="background:{_shade(SHADE_FULL_BITS)}">green</span>: {html.escape(after_label)} finds the token '
        f'more expected; <span style="background:{_shade(-SHADE_FULL_BITS)}">red</span>: less (full colour at '
        f"{SHADE_FULL_BITS:g} bits; hover a token for both figures)"
    )
    text = "".join(spans)
    return (
        f'<div class="trainbook-token-bits"><p>{legend}</p>'
        f'<pre style="line-height:1.5; padding:0.5em; border:1px solid #ccc">{text}</pre></div>'
    )
