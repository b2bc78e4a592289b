"""The README's example: a multi-head self-attention with one bug (the logits divided by
sqrt(d_model) instead of sqrt(head_dim)). `attention-conformance check
my_attention.py::MyAttention` from this folder finds it."""

import math

from torch import nn


class MyAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)      # sqrt(d_model), not head_dim
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))
