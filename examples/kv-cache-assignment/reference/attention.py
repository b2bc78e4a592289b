"""Reference solution: causal multi-head self-attention with a KV cache for decoding."""

from __future__ import annotations

import math

import torch
from torch import nn


class CachedSelfAttention(nn.Module):
    """Causal multi-head self-attention. ``forward(x, past_kv)`` returns the output and the cache
    ``(k, v)``, each of shape (batch, num_heads, past + length, head_dim)."""

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

    def forward(self, x: torch.Tensor,
                past_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        batch, length, _ = x.shape
        q, k, v = (self._split(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        if past_kv is not None:
            k = torch.cat([past_kv[0], k], dim=2)
            v = torch.cat([past_kv[1], v], dim=2)
        total = k.shape[2]
        scores = (q / math.sqrt(self.head_dim)) @ k.transpose(-2, -1)
        # Query i is position total - length + i: it sees keys 0 .. total - length + i.
        future = torch.ones(length, total, dtype=torch.bool, device=x.device).triu(total - length + 1)
        scores = scores.masked_fill(future, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, length, -1)
        return self.out_proj(out), (k, v)
