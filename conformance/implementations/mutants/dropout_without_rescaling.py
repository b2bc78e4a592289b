"""Mutant: dropout mask without the 1/(1 - p) rescaling.

Bug: ``weights * bernoulli(1 - p)`` with no division by (1 - p): the expected output shrinks by
(1 - p) in training. Symptom: the mean over many train-mode draws misses the eval output.
Caught by: ``dropout``.
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "dropout"


class DropoutWithoutRescaling(TextbookAttention):
    def drop(self, weights):
        if not self.training or self.p == 0:
            return weights
        keep = torch.rand_like(weights) >= self.p
        return weights * keep


IMPLEMENTATION = declare("mutant-dropout-without-rescaling", DropoutWithoutRescaling,
                         description="dropout mask without the 1/(1 - p) rescaling")
