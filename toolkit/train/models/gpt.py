"""A GPT-style causal language model over bytes (vocabulary 256), in the nanoGPT mould."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

VOCAB_SIZE = 256  # one token per byte: no tokenizer to ship or download
ACTIVATIONS = {"silu": nn.SiLU, "gelu": nn.GELU, "relu": nn.ReLU}


def packed_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """(B, 1, T, T) bool: token i may attend to token j when j <= i and both are in the same example, an example
    starting wherever the position does not follow on from the one before (transformers' rule for packed rows)."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    example = starts.cumsum(dim=1)  # (B, T): which example each token belongs to
    T = position_ids.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=position_ids.device).tril()
    return ((example[:, :, None] == example[:, None, :]) & causal)[:, None]


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.head_dim = cfg.n_embd // cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=False)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x, mask=None):
        B, T, _ = x.shape
        # q, k, v side by side; under tensor parallelism each holds this rank's heads only (toolkit.train.parallel),
        # so the widths and the head count come from the projection's output, not the config
        q, k, v = self.qkv(x).chunk(3, dim=2)
        # (B, T, heads * head_dim) -> (B, heads, T, head_dim) for scaled_dot_product_attention
        q, k, v = (t.view(B, T, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        dropout = self.dropout if self.training else 0.0
        # mask: packed rows' block-diagonal causal mask (B, 1, T, T); else plain causal attention
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, dropout_p=dropout)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, -1))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False),
            ACTIVATIONS[cfg.activation](),
            nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False),
            nn.Dropout(cfg.dropout),
        )

    def forward(self, x, mask=None):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.block_size = cfg.block_size
        # model.activation_checkpointing: keep only each block's input from forward and recompute the rest in backward
        self.activation_checkpointing = cfg.activation_checkpointing
        self.wte = nn.Embedding(VOCAB_SIZE, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd)
        self.lm_head = nn.Linear(cfg.n_embd, VOCAB_SIZE, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying: fewer parameters, better small-data loss
        self.apply(self._init_weights)
        # GPT-2's scaled init of the residual projections keeps the residual stream's variance flat in depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / (2 * cfg.n_layer) ** 0.5)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None, position_ids=None):
        """Logits, or the mean cross entropy against ``targets`` (IGNORE_INDEX positions left out). With
        ``position_ids`` (packed rows, toolkit.data.batch), each example has its own positions and attends only
        to itself."""
        T = idx.shape[1]
        mask = None
        if position_ids is None:
            pos = torch.arange(T, device=idx.device)
        else:
            pos, mask = position_ids, packed_causal_mask(position_ids)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        # only while training with autograd on: eval and no-grad forwards save nothing, so there is nothing to recompute
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            # non-reentrant: gradients reach frozen-input blocks (LoRA), and the RNG state is replayed for dropout
            x = checkpoint(block, x, mask, use_reentrant=False) if recompute else block(x, mask)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, VOCAB_SIZE), targets.reshape(-1))


def training_flops_per_token(model: nn.Module, cfg) -> float:
    """FLOPs to train on one token, as in the PaLM paper (appendix B) and nanoGPT's estimate_mfu.

    6N for the matmuls of the N non-embedding-table parameters (2 forward + 4 backward per weight), plus
    the attention scores and their weighted sum, which have no parameters: 12 * layers * width * context.
    The tied token embedding counts once, as the lm_head matmul; the position table is a lookup, not a matmul.
    """
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
