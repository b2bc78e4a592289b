import math

import torch
from torch import nn


class MultiheadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None, causal=False):
        b, n, d = x.shape
        h = self.num_heads
        q, k, v = (w(x).reshape(b, n, h, d // h).permute(0, 2, 1, 3) for w in (self.w_q, self.w_k, self.w_v))
        s = q @ k.transpose(2, 3) / math.sqrt(d // h)
        if mask is not None:
            s = s.masked_fill(~mask.view(b, 1, 1, n), float("-inf"))
        if causal:
            s = s.masked_fill(torch.ones(n, n).triu(1).bool(), float("-inf"))
        return self.w_o((s.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(b, n, d))


class CausalSelfAttention(MultiheadAttention):
    def forward(self, x):
        return super().forward(x, causal=True)
