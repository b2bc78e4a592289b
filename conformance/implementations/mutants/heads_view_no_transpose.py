"""Mutant: heads split with ``view`` and no transpose.

Bug: ``x.view(B, H, L, Dh)`` on a (B, L, H * Dh) tensor: the memory is reinterpreted, so "head" h
mixes feature slices of several positions. Symptom: output differs from per-head attention
concatenated, unless B, L and H happen to make it coincide. Caught by: ``head_split``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "head_split"


class ViewWithoutTranspose(TextbookAttention):
    def split_heads(self, x, length):
        return x.view(x.shape[0], self.num_heads, length, self.head_dim)


IMPLEMENTATION = declare("mutant-heads-view-no-transpose", ViewWithoutTranspose,
                         description="heads split with view(B, H, L, Dh), no transpose")
