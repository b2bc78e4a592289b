import math

import torch
import torch.nn as nn


class CachedSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.dk = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, x, past_kv=None):
        B, T, D = x.shape
        q = self.W_q(x).view(B, T, self.h, self.dk)
        k = self.W_k(x).view(B, T, self.h, self.dk).permute(0, 2, 1, 3)
        v = self.W_v(x).view(B, T, self.h, self.dk).permute(0, 2, 1, 3)
        if past_kv is not None:
            past_k, past_v = past_kv
            k = torch.cat((past_k, k), dim=2)
            v = torch.cat((past_v, v), dim=2)
        S = k.shape[2]
        P = S - T  # tokens already in the cache
        att = torch.einsum("bthd,bhsd->bhts", q, k) / math.sqrt(self.dk)
        rows = torch.arange(T, device=x.device)[:, None] + P
        cols = torch.arange(S, device=x.device)[None, :]
        att = att.masked_fill(cols > rows, float("-inf"))
        att = att.softmax(dim=-1)
        y = torch.einsum("bhts,bhsd->bthd", att, v).reshape(B, T, D)
        return self.W_o(y), (k, v)
