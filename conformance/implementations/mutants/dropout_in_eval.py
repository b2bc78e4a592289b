"""Mutant: F.dropout without training=self.training.

Bug: ``F.dropout(weights, p)``: its ``training`` argument defaults to True, so dropout stays on
in eval mode. Symptom: two eval calls differ.
Caught by: ``determinism``.
"""

from __future__ import annotations

import torch.nn.functional as F

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "determinism"


class DropoutInEval(TextbookAttention):
    def drop(self, weights):
        return F.dropout(weights, self.p)


IMPLEMENTATION = declare("mutant-dropout-in-eval", DropoutInEval,
                         description="F.dropout without training=self.training")
