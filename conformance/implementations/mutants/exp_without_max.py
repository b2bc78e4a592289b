"""Mutant: hand-written softmax without subtracting the row maximum.

Bug: ``exp(s) / exp(s).sum(-1)`` with no ``s - s.max(-1)``: large logits overflow to inf and the
row becomes NaN. Symptom: logits around 1e4 give NaN.
Caught by: ``stability``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "stability"


class ExpWithoutMax(TextbookAttention):
    def softmax(self, scores):
        e = scores.exp()
        return e / e.sum(dim=-1, keepdim=True)


IMPLEMENTATION = declare("mutant-exp-without-max", ExpWithoutMax,
                         description="hand-written softmax without subtracting the row maximum")
