"""Mutant: hand-written softmax backward missing a term.

Bug: a custom autograd softmax whose backward returns ``y * g`` instead of
``y * (g - (g * y).sum(-1))``. Symptom: gradcheck fails; gradients differ from the reference.
Caught by: ``autograd``.
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "autograd"



class _SoftmaxWithWrongBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores):
        weights = torch.softmax(scores, dim=-1)
        ctx.save_for_backward(weights)
        return weights

    @staticmethod
    def backward(ctx, grad):
        (weights,) = ctx.saved_tensors
        return weights * grad  # missing: - weights * (grad * weights).sum(-1, keepdim=True)


class CustomSoftmaxBackward(TextbookAttention):
    def softmax(self, scores):
        return _SoftmaxWithWrongBackward.apply(scores)


IMPLEMENTATION = declare("mutant-custom-softmax-backward", CustomSoftmaxBackward,
                         description="hand-written softmax backward missing a term")
