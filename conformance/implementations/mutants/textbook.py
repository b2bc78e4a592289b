"""A correct textbook multi-head attention, written step by step so a mutant can break one step.

``TextbookAttention(d_model, num_heads, causal=False, dropout=0.0)`` with ``forward(query, key,
value, mask=None)``: int or bool mask with 0/False = masked, shape (batch, 1, 1, kv_len) (the full
(batch, heads, q_len, kv_len) works too); ``-inf`` fill; dropout on the weights after the softmax;
q scaled before the product so float16 doesn't overflow. Each mutant in this package subclasses
it and overrides exactly the step its bug lives in, so the bug is the only difference from code
that passes every check.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from conformance import (
    Capabilities,
    CausalForm,
    Dtypes,
    Implementation,
    MaskConvention,
    MaskKind,
    MaskLayout,
    SeparateProjections,
)

ALL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INT_MASK = MaskConvention(MaskKind.KEEP_INT, MaskLayout.BROADCAST)
OTHER_MASKS = (MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.BROADCAST),
               MaskConvention(MaskKind.KEEP_INT, MaskLayout.PER_HEAD))


class TextbookAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, causal: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.causal = causal
        self.p = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def prepare(self, query, key, value):
        """Anything done to the inputs before the projections (nothing)."""
        return query, key, value

    def project(self, query, key, value):
        return self.q_proj(query), self.k_proj(key), self.v_proj(value)

    def split_heads(self, x: torch.Tensor, length: int) -> torch.Tensor:
        """(B, L, H * Dh) -> (B, H, L, Dh)."""
        return x.view(x.shape[0], length, self.num_heads, self.head_dim).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L, Dh) -> (B, L, H * Dh)."""
        batch, heads, length, head_dim = x.shape
        return x.transpose(1, 2).reshape(batch, length, heads * head_dim)

    def logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (q / math.sqrt(self.head_dim)) @ k.transpose(-2, -1)

    def future(self, q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
        """True where a query row must not see a key: every later position."""
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).triu(diagonal=1)

    def apply_mask(self, scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            return scores
        return scores.masked_fill(mask == 0, float("-inf"))

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores, dim=-1)

    def drop(self, weights: torch.Tensor) -> torch.Tensor:
        return F.dropout(weights, self.p, training=self.training)

    def attend(self, scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Masked softmax over the keys, then dropout."""
        return self.drop(self.softmax(self.apply_mask(scores, mask)))

    def combine(self, weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The weighted sum of the values."""
        return weights @ v

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        """The output projection."""
        return self.out_proj(x)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        query, key, value = self.prepare(query, key, value)
        q, k, v = self.project(query, key, value)
        q = self.split_heads(q, query.shape[1])
        k = self.split_heads(k, key.shape[1])
        v = self.split_heads(v, value.shape[1])
        scores = self.logits(q, k)
        if self.causal:
            scores = scores.masked_fill(self.future(q.shape[-2], k.shape[-2], q.device),
                                        float("-inf"))
        return self.finish(self.merge_heads(self.combine(self.attend(scores, mask), v)))


def declare(name: str, module: type[TextbookAttention], *, causal: bool = False,
            description: str, **capabilities: object) -> Implementation:
    """The declaration textbook-derived modules share; ``capabilities`` overrides what differs."""
    declared = dict(call="qkv", mask=INT_MASK, mask_formats=OTHER_MASKS,
                    causality=CausalForm("always" if causal else "never"), cross_attention=not causal,
                    floats=Dtypes(ALL_DTYPES), dropout="config", fully_masked="nan")
    declared.update(capabilities)
    return Implementation(
        name,
        lambda c: module(c.d_model, c.num_heads, causal=causal, dropout=c.dropout),
        Capabilities(**declared),
        SeparateProjections(q="q_proj", k="k_proj", v="v_proj", o="out_proj"),
        description=description,
        # Mutants are subjects for the checks, not for speed; the textbook controls are timed.
        benchmark=module is TextbookAttention,
    )


IMPLEMENTATIONS = [
    declare("textbook", TextbookAttention,
            description="correct control: the textbook the mutants are made from"),
    declare("textbook-causal", TextbookAttention, causal=True,
            description="correct control: the causal textbook the causal mutants are made from"),
]
