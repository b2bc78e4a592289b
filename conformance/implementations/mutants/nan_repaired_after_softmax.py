"""Mutant: NaN of fully masked rows repaired after the softmax (finite output, NaN gradients).

Bug: an additive mask (0 or -inf) added to the scores, then ``softmax(...).nan_to_num(0.0)``:
the forward turns the NaN of a row with every key masked into zeros, so the output looks like
SDPA's, but the backward still goes through the softmax of a row of -inf, and the addition
passes its NaN gradient on to the scores. Symptom: a batch with a fully masked row (an empty
sequence, left padding under a causal mask) gives finite outputs and NaN gradients for its
inputs and for every parameter: training silently dies.
Caught by: ``fully_masked``.
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "fully_masked"


class NanRepairedAfterSoftmax(TextbookAttention):
    def apply_mask(self, scores, mask):
        if mask is None:
            return scores
        return scores + torch.zeros_like(scores).masked_fill(mask == 0, float("-inf"))

    def softmax(self, scores):
        return torch.softmax(scores, dim=-1).nan_to_num(0.0)


IMPLEMENTATION = declare("mutant-nan-repaired-after-softmax", NanRepairedAfterSoftmax,
                         description="NaN rows zeroed after the softmax: finite output, NaN "
                                     "gradients", fully_masked="zeros")
