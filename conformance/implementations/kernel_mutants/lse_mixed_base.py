"""Kernel mutant: the log-sum-exp returned in two bases at once.

Bug: a kernel half converted to exp2 arithmetic returns ``m + log2(l)``: the row's max in natural
units with the base-2 log of its sum (Triton kernels keep both in base 2, or both natural). The
backward uses its own, right, log-sum-exp. Symptom: the output and every gradient are exact; the
lse returned with ``return_lse=True`` is neither the natural nor the base-2 logsumexp. Caught by:
``kernel``.
"""

from __future__ import annotations

import torch

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "kernel"
EXPOSED_BY = {"return_lse": True}
"""The arguments under which it differs from the correct kernel (with fewer queries than keys)."""


class LseMixedBase(Kernel):
    def returned_lse(self, m, total):
        return m + torch.log2(total)


KERNEL = kernel_function(LseMixedBase(), "bhld", "lse_mixed_base")
