"""Kernel mutant: the softmax Jacobian without its row-sum term.

Bug: the backward computes dS = P * dP, forgetting ``- rowsum(dP * P)`` (FlashAttention's
``D = rowsum(dO * O)``). Symptom: the forward is exact; dQ and dK are wrong (with one key, dQ
should be 0 and is not). Caught by: ``reference`` (the gradient, in float16 and bfloat16).
"""

from __future__ import annotations

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "reference"


class JacobianRowsumMissing(Kernel):
    def ds(self, p, dp, delta):
        return p * dp


KERNEL = kernel_function(JacobianRowsumMissing(), "bhld", "jacobian_rowsum_missing")
