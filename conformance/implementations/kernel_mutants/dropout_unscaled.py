"""Kernel mutant: dropout without the 1 / (1 - p) rescaling.

Bug: the weights a dropout draw keeps are not scaled by 1 / (1 - p), so a train-mode output is
on average (1 - p) times the eval one. Symptom: exact in eval mode and at p = 0 (every other
check); in train mode the mean of many draws is biased towards 0. Caught by: ``dropout`` (the
train-mode mean against the eval output, in half precision).
"""

from __future__ import annotations

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "dropout"


class DropoutUnscaled(Kernel):
    def dropped(self, p, kept, start, options):
        return p if kept is None else p * kept[..., start:start + p.shape[-1]]


KERNEL = kernel_function(DropoutUnscaled(), "bhld", "dropout_unscaled")
