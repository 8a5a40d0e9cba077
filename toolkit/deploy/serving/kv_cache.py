"""Generation with a KV cache for many requests at once: one forward per step gives every row its next token.

Each request joins with its prompt (a prefill forward of its own, which also gives its first token); from then on
it is a row of one batched cache and costs one position of one forward per token, instead of a forward over its
whole context. Rows joined at different times have different lengths: the cache is left-padded to the longest,
an attention mask hides the padding and each row keeps its own position ids, so a row's logits are those it would
have alone (up to float rounding). Rows leave at any step; padding no row needs any more is cut off.

Works for transformers models whose cache is one full-attention layer per layer (Llama, GPT-2, GPT-NeoX, Mistral
without a sliding window, ...): :func:`supports_batched_cache` says whether a model's is.

Everything lives on the model's device (a GPU's cache stays there); the logits returned are on it too, and the
caller brings to the host only the rows it samples from.
"""

from __future__ import annotations

import inspect

import torch


def _layers(cache) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]


def _cache_of(out):
    """The cache a forward returned: ``cache`` in transformers 5.2x, ``past_key_values`` before (5.17, the GPU
    image's)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)


def _cache_argument(model) -> str:
    """The name the model's forward takes a cache under (renamed like the output: ``cache``, ``past_key_values``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def supports_batched_cache(model) -> bool:
    """Does the model keep a plain, full-length key/value pair per layer (what rows can be padded and stacked in)?
    Sliding-window, recurrent and offloaded caches cannot, and such a model generates without a cache."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    with torch.inference_mode():
        out = model(input_ids=torch.zeros((1, 2), dtype=torch.long, device=_device(model)), use_cache=True)
    cache = _cache_of(out)
    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if not missing:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)


class CachedDecoder:
    """Rows generating together over one left-padded KV cache; ``members`` says whose each row is."""

    def __init__(self, model):
        self.model = model
        self.device = _device(model)
        self.cache_argument = _cache_argument(model)
        self.members: list = []
        self.keys: list[torch.Tensor] = []  # per layer: (rows, heads, length, head_dim)
        self.values: list[torch.Tensor] = []
        # (rows, length): 1 at a real position, 0 at padding
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=self.device)
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)  # each row's next position (its length)

    def __len__(self) -> int:
        return len(self.members)

    @torch.inference_mode()
    def join(self, member, ids: list[int]) -> torch.Tensor:
        """Add a row for ``member`` with prompt ``ids``; returns the logits that predict its first new token."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        out = self.model(input_ids=x, attention_mask=torch.ones_like(x), use_cache=True)
        keys, values = _layers(_cache_of(out))
        width = max(self.mask.shape[1], len(ids))
        if self.members:
            self.keys = [torch.cat([_left_pad(a, width, 2), _left_pad(b, width, 2)]) for a, b in zip(self.keys, keys)]
            self.values = [
                torch.cat([_left_pad(a, width, 2), _left_pad(b, width, 2)]) for a, b in zip(self.values, values)
            ]
        else:
            self.keys, self.values = keys, values
        self.mask = torch.cat([_left_pad(self.mask, width, 1), _left_pad(torch.ones_like(x), width, 1)])
        self.positions = torch.cat([self.positions, torch.tensor([len(ids)], device=self.device)])
        self.members.append(member)
        return out.logits[0, -1]

    @torch.inference_mode()
    def step(self, tokens: list[int]) -> torch.Tensor:
        """Feed each row its newest token (in ``members`` order); returns each row's next-token logits."""
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache(ddp_cache_data=list(zip(self.keys, self.values)))
        self.mask = torch.cat([self.mask, torch.ones((len(self), 1), dtype=torch.long, device=self.device)], dim=1)
        out = self.model(
            input_ids=torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None],
            attention_mask=self.mask,
            position_ids=self.positions[:, None],
            use_cache=True,
            **{self.cache_argument: cache},
        )
        self.keys, self.values = _layers(_cache_of(out))
        self.positions = self.positions + 1
        return out.logits[:, -1]

    def retain(self, members: list) -> None:
        """Keep the rows of ``members`` (all of them rows now), in that order; drop the others' memory at once."""
        if members == self.members:
            return
        if not members:
            self.__init__(self.model)
            return
        rows = torch.tensor([self.members.index(m) for m in members], device=self.device)
        mask = self.mask[rows]
        start = int(mask.any(dim=0).long().argmax())  # leading columns that are padding in every kept row
        self.keys = [k[rows, :, start:] for k in self.keys]
        self.values = [v[rows, :, start:] for v in self.values]
        self.mask, self.positions, self.members = mask[:, start:], self.positions[rows], list(members)
