"""A correct textbook multi-head attention, written step by step so a mutant can break one step.

``TextbookAttention(d_model, num_heads, causal=False)`` with ``forward(query, key, value,
mask=None)``: int mask with 0 = masked, shape (batch, 1, 1, kv_len); ``-inf`` fill. Each mutant in
this package subclasses it and overrides exactly the step its bug lives in, so the bug is the only
difference from code that passes every check.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from conformance import (
    Capabilities,
    Implementation,
    MaskConvention,
    MaskKind,
    MaskLayout,
    SeparateProjections,
)


class TextbookAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, causal: bool = False) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.causal = causal
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, H * Dh) -> (B, H, L, Dh)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L, Dh) -> (B, L, H * Dh)."""
        batch, heads, length, head_dim = x.shape
        return x.transpose(1, 2).reshape(batch, length, heads * head_dim)

    def future(self, q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
        """True where a query row must not see a key: every later position."""
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).triu(diagonal=1)

    def attend(self, scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Masked softmax over the keys."""
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        return torch.softmax(scores, dim=-1)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        q = self.split_heads(self.q_proj(query))
        k = self.split_heads(self.k_proj(key))
        v = self.split_heads(self.v_proj(value))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if self.causal:
            scores = scores.masked_fill(self.future(q.shape[-2], k.shape[-2], q.device),
                                        float("-inf"))
        weights = self.attend(scores, mask)
        return self.out_proj(self.merge_heads(weights @ v))


def declare(name: str, module: type[TextbookAttention], *, causal: bool = False,
            description: str) -> Implementation:
    """The declaration every textbook-derived module shares: only the class and causality vary."""
    return Implementation(
        name,
        lambda c: module(c.d_model, c.num_heads, causal=causal),
        Capabilities(call="qkv", mask=MaskConvention(MaskKind.KEEP_INT, MaskLayout.BROADCAST),
                     causal="always" if causal else "never", cross_attention=not causal),
        SeparateProjections(q="q_proj", k="k_proj", v="v_proj", o="out_proj"),
        description=description,
    )


IMPLEMENTATIONS = [
    declare("textbook", TextbookAttention,
            description="correct control: the textbook the mutants are made from"),
    declare("textbook-causal", TextbookAttention, causal=True,
            description="correct control: the causal textbook the causal mutants are made from"),
]
