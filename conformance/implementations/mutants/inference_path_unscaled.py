"""Mutant: a no-grad fast path that forgets the scale.

Bug: an inference-only branch (``if not torch.is_grad_enabled()``) recomputes the logits
without the 1/sqrt(head_dim) factor. Symptom: no_grad and autograd-enabled calls differ.
Caught by: ``path_agreement``.
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "path_agreement"


class InferencePathUnscaled(TextbookAttention):
    def logits(self, q, k):
        if not torch.is_grad_enabled():
            return q @ k.transpose(-2, -1)
        return super().logits(q, k)


IMPLEMENTATION = declare("mutant-inference-path-unscaled", InferencePathUnscaled,
                         description="a no-grad fast path that forgets the scale")
