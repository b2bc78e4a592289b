"""Mutant: no 1/sqrt(head_dim) scaling.

Bug: ``q @ k.transpose(-2, -1)`` with no scaling: the softmax is too peaked.
Symptom: the fitted logit scale is 1.
Caught by: ``scale``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "scale"


class ScaleMissing(TextbookAttention):
    def logits(self, q, k):
        return q @ k.transpose(-2, -1)


IMPLEMENTATION = declare("mutant-scale-missing", ScaleMissing,
                         description="no 1/sqrt(head_dim) scaling")
