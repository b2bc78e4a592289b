"""Mutant: softmax over the query axis.

Bug: ``torch.softmax(scores, dim=-2)``: each column (key) is normalised over the queries instead
of each row over the keys. Symptom: attention rows don't sum to 1 (columns do).
Caught by: ``row_stochastic``.
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "row_stochastic"


class SoftmaxOverQueries(TextbookAttention):
    def attend(self, scores, mask):
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        return torch.softmax(scores, dim=-2)


IMPLEMENTATION = declare("mutant-softmax-query-axis", SoftmaxOverQueries,
                         description="softmax over the query axis (dim=-2)")
