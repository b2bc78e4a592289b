"""Mutant: 1/sqrt(head_dim) applied to q and again to the product.

Bug: q is scaled by 1/sqrt(head_dim) and the product is divided by sqrt(head_dim) again.
Symptom: the fitted logit scale is 1/head_dim.
Caught by: ``scale``.
"""

from __future__ import annotations

import math

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "scale"


class ScaleAppliedTwice(TextbookAttention):
    def logits(self, q, k):
        scale = math.sqrt(self.head_dim)
        return ((q / scale) @ k.transpose(-2, -1)) / scale


IMPLEMENTATION = declare("mutant-scale-applied-twice", ScaleAppliedTwice,
                         description="1/sqrt(head_dim) applied to q and again to the product")
