"""Mutant: divides the logits by sqrt(d_model).

Bug: ``/ math.sqrt(d_model)`` (the whole hidden size) instead of ``sqrt(head_dim)``: the softmax
is too flat. Symptom: the fitted logit scale is 1/sqrt(d_model).
Caught by: ``scale``.
"""

from __future__ import annotations

import math

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "scale"


class ScaleSqrtDModel(TextbookAttention):
    def logits(self, q, k):
        return (q / math.sqrt(self.num_heads * self.head_dim)) @ k.transpose(-2, -1)


IMPLEMENTATION = declare("mutant-scale-sqrt-d-model", ScaleSqrtDModel,
                         description="divides the logits by sqrt(d_model)")
