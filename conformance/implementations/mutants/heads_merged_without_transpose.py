"""Mutant: heads merged with reshape and no transpose.

Bug: ``out.reshape(B, L, H * Dh)`` straight from (B, H, L, Dh): rows of different positions and
heads are interleaved. Symptom: the output is not the per-head attentions concatenated.
Caught by: ``head_split``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "head_split"


class HeadsMergedWithoutTranspose(TextbookAttention):
    def merge_heads(self, x):
        batch, heads, length, head_dim = x.shape
        return x.reshape(batch, length, heads * head_dim)


IMPLEMENTATION = declare("mutant-heads-merged-without-transpose", HeadsMergedWithoutTranspose,
                         description="heads merged with reshape and no transpose")
