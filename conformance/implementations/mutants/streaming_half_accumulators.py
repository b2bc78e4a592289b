"""Mutant: streaming (online-softmax) attention whose running sums stay in half precision.

Bug: the online-softmax recurrence (Milakov and Gimelshein; the inner loop of FlashAttention),
written key by key, keeps its running maximum, softmax denominator and output accumulator in the
input's dtype. In float32 that is fine; in float16 and bfloat16 every key's update rounds the
running sums again, so the error grows with the number of keys (FlashAttention keeps them in
float32 whatever the input dtype). Symptom: accurate at a few keys, around ten times the error of
plain half-precision attention at 512 keys.
Caught by: ``low_precision``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "low_precision"
BLOCK = 1
"""Keys per step of the recurrence: one, as the recurrence is written down."""


class StreamingHalfAccumulators(TextbookAttention):
    def attend(self, scores, mask):
        # The softmax happens block by block in combine(); here only the mask is applied.
        return self.apply_mask(scores, mask)

    def combine(self, scores, v):
        dtype = scores.dtype  # the bug: float32 is what the running sums need
        shape = (*scores.shape[:-1], 1)
        running_max = torch.full(shape, float("-inf"), dtype=dtype, device=scores.device)
        denominator = torch.zeros(shape, dtype=dtype, device=scores.device)
        accumulator = torch.zeros(*scores.shape[:-1], v.shape[-1], dtype=dtype,
                                  device=scores.device)
        for start in range(0, scores.shape[-1], BLOCK):
            block = scores[..., start:start + BLOCK]
            new_max = torch.maximum(running_max, block.amax(dim=-1, keepdim=True))
            safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
            correction = torch.exp(running_max - safe_max)
            weights = torch.exp(block - safe_max)
            denominator = denominator * correction + weights.sum(dim=-1, keepdim=True)
            dropped = F.dropout(weights, self.p, training=self.training)
            accumulator = accumulator * correction + dropped @ v[..., start:start + BLOCK, :]
            running_max = new_max
        return accumulator / denominator


IMPLEMENTATION = declare("mutant-streaming-half-accumulators", StreamingHalfAccumulators,
                         description="online softmax with running sums kept in float16/bfloat16")
