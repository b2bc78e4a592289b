"""Mutant: forward fails without a mask.

Bug: ``scores.masked_fill(mask == 0, ...)`` with no ``if mask is not None``: calling it without
a mask raises. Symptom: the basic call fails.
Caught by: ``gate``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "gate"


class MaskRequired(TextbookAttention):
    def apply_mask(self, scores, mask):
        return scores.masked_fill(mask == 0, float("-inf"))


IMPLEMENTATION = declare("mutant-mask-required", MaskRequired,
                         description="forward fails without a mask")
