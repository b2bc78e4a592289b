import math

import torch
from heads import merge_heads, split_heads
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        q, k, v = (split_heads(p(x), self.num_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(mask[:, None, None, :], float("-inf"))  # hide the masked ones
        return self.out_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))


class CausalSelfAttention(MultiHeadAttention):
    def forward(self, x):
        n = x.shape[1]
        q, k, v = (split_heads(p(x), self.num_heads) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return self.out_proj(merge_heads(torch.softmax(scores, dim=-1) @ v))
