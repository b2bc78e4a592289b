"""Mutant: padding mask applied after the softmax.

Bug: ``softmax(scores).masked_fill(mask == 0, 0)``: masked keys get weight 0, but the kept
weights were normalised together with the masked keys' logits and no longer sum to 1. Symptom:
changing a masked key changes the output. Caught by: ``padding``.
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "padding"


class MaskAfterSoftmax(TextbookAttention):
    def attend(self, scores, mask):
        weights = torch.softmax(scores, dim=-1)
        if mask is not None:
            weights = weights.masked_fill(mask == 0, 0.0)
        return weights


IMPLEMENTATION = declare("mutant-mask-after-softmax", MaskAfterSoftmax,
                         description="padding mask applied after the softmax")
