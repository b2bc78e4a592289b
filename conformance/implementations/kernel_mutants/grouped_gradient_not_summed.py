"""Kernel mutant: the key/value gradient of grouped heads not summed over the group.

Bug: with G query heads sharing each key/value head, dK and dV are each query head's share
summed over its group; the backward keeps only the first head's share (``dk[:, ::G]``), as a
kernel that writes dK per query head and reduces with a strided copy does. Symptom: exact
forward, exact dQ, and exact everything without grouping (G = 1); with grouped heads the key and
value gradients miss the other heads' shares. Caught by: ``reference`` (the key and value
inputs' gradients, with fewer key/value heads than query heads).
"""

from __future__ import annotations

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "reference"
KV_HEADS = 1
"""The key/value heads it is exposed with (its query heads: 3): one group of three."""


class GroupedGradientNotSummed(Kernel):
    def grouped(self, gradient, groups):
        return gradient[:, ::groups]


KERNEL = kernel_function(GroupedGradientNotSummed(), "blhd", "grouped_gradient_not_summed")
