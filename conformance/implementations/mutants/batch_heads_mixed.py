"""Mutant: reshape that mixes batch and heads.

Bug: ``x.view(H, B, L, Dh)``-style reshape: heads of one batch element take features of
another. Symptom: changing one batch element changes the others.
Caught by: ``batch_independence``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "batch_independence"


class BatchHeadsMixed(TextbookAttention):
    def split_heads(self, x, length):
        batch = x.shape[0]
        return x.reshape(self.num_heads, batch, length, self.head_dim).transpose(0, 1)


IMPLEMENTATION = declare("mutant-batch-heads-mixed", BatchHeadsMixed,
                         description="reshape that mixes batch and heads")
