import math

import torch
from torch import nn

from .util import causal_mask


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _attend(self, x, mask=None, causal=False):
        b, n, d = x.shape
        h = self.num_heads
        q, k, v = (p(x).view(b, n, h, d // h).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // h)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        if causal:
            scores = scores.masked_fill(causal_mask(n, x.device), float("-inf"))
        weights = torch.softmax(scores, dim=-2)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(b, n, d))

    def forward(self, x, mask=None):
        return self._attend(x, mask)


class CausalSelfAttention(MultiHeadAttention):
    def forward(self, x):
        return self._attend(x, causal=True)
