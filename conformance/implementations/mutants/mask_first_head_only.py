"""Mutant: padding mask applied to head 0 only.

Bug: the mask is applied to ``scores[:, :1]`` (head 0) only, e.g. after indexing a per-head mask
with ``mask[:, 0]``. Symptom: every other head attends to the padding.
Caught by: ``padding``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "padding"


class MaskFirstHeadOnly(TextbookAttention):
    def apply_mask(self, scores, mask):
        if mask is None:
            return scores
        masked = scores.clone()
        masked[:, :1] = scores[:, :1].masked_fill(mask[:, :1] == 0, float("-inf"))
        return masked


IMPLEMENTATION = declare("mutant-mask-first-head-only", MaskFirstHeadOnly,
                         description="padding mask applied to head 0 only")
