"""Mutant: an additive mask built in float32 promotes float16 output to float32.

Bug: the additive mask is built with a hard-coded ``dtype=torch.float32``; adding it to float16
scores promotes them, and the hand-written weighted sum (a broadcast multiply, which promotes
where ``@`` would refuse) carries float32 on, until the float16 output projection refuses it.
Symptom: every float16 call fails with a dtype mismatch.
Caught by: ``low_precision``.
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "low_precision"


class MaskDtypePromotes(TextbookAttention):
    def apply_mask(self, scores, mask):
        additive = torch.zeros(scores.shape[-1], dtype=torch.float32, device=scores.device)
        if mask is not None:
            additive = additive.masked_fill(mask == 0, float("-inf"))
        return scores + additive

    def combine(self, weights, v):
        return (weights.unsqueeze(-1) * v.unsqueeze(-3)).sum(dim=-2)


IMPLEMENTATION = declare("mutant-mask-dtype-promotes", MaskDtypePromotes,
                         description="additive mask built in float32: promotes float16 output")
