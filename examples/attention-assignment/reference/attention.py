"""Reference solution: multi-head attention with a padding mask, and causal self-attention."""

from __future__ import annotations

import math

import torch
from torch import nn


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention. ``mask``: bool (batch, length), True = a real token."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not a multiple of num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def attend(self, x: torch.Tensor, mask: torch.Tensor | None = None,
               causal: bool = False) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (self._split(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        scores = (q / math.sqrt(self.head_dim)) @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        if causal:
            future = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, length, -1)
        return self.out_proj(out)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.attend(x, mask)


class CausalSelfAttention(MultiHeadAttention):
    """Each position attends to itself and the positions before it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attend(x, causal=True)
