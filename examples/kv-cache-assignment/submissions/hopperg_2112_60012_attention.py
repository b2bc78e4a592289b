import math

import torch
import torch.nn as nn


class CachedSelfAttention(nn.Module):
    """Correct attention; the cache it returns keeps the heads merged: (B, L, d_model) each."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.dk = d_model // num_heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, past_kv=None):
        B, T, D = x.shape
        k_flat, v_flat = self.key(x), self.value(x)
        if past_kv is not None:
            k_flat = torch.cat((past_kv[0], k_flat), dim=1)
            v_flat = torch.cat((past_kv[1], v_flat), dim=1)
        S = k_flat.shape[1]
        q = self.query(x).view(B, T, self.h, self.dk).transpose(1, 2)
        k = k_flat.view(B, S, self.h, self.dk).transpose(1, 2)
        v = v_flat.view(B, S, self.h, self.dk).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dk)
        future = torch.ones(T, S, dtype=torch.bool, device=x.device).triu(S - T + 1)
        scores = scores.masked_fill(future, float("-inf"))
        y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, D)
        return self.proj(y), (k_flat, v_flat)
