"""A small MLP classifier for scikit-learn's 8x8 digits: the second built-in that keeps the loop model-agnostic."""

from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F

from toolkit.train.models.gpt import ACTIVATIONS

N_PIXELS = 64
N_CLASSES = 10


class DigitsMLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        layers, width = [], N_PIXELS
        for _ in range(cfg.n_layer):
            layers += [nn.Linear(width, cfg.n_embd), ACTIVATIONS[cfg.activation](), nn.Dropout(cfg.dropout)]
            width = cfg.n_embd
        layers.append(nn.Linear(width, N_CLASSES))
        self.net = nn.Sequential(*layers)

    def forward(self, x, targets=None):
        logits = self.net(x)
        if targets is None:
            return logits
        return F.cross_entropy(logits, targets)
