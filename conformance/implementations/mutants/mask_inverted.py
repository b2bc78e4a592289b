"""Mutant: mask read with 1 = masked.

Bug: ``masked_fill(mask == 1, -inf)``: the kept keys are hidden and the padding is attended.
Symptom: output depends on the padded keys only.
Caught by: ``padding``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "padding"


class MaskInverted(TextbookAttention):
    def apply_mask(self, scores, mask):
        if mask is None:
            return scores
        return scores.masked_fill(mask == 1, float("-inf"))


IMPLEMENTATION = declare("mutant-mask-inverted", MaskInverted,
                         description="mask read with 1 = masked")
