"""Mutant: masked_fill(-1e9): overflows float16.

Bug: ``masked_fill(mask == 0, -1e9)``: -1e9 is not representable in float16, where masked_fill
raises. Symptom: masked calls fail in float16.
Caught by: ``low_precision``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "low_precision"


class FillMinus1e9(TextbookAttention):
    def apply_mask(self, scores, mask):
        if mask is None:
            return scores
        return scores.masked_fill(mask == 0, -1e9)


IMPLEMENTATION = declare("mutant-fill-minus-1e9", FillMinus1e9,
                         description="masked_fill(-1e9): overflows float16", fully_masked="uniform")
