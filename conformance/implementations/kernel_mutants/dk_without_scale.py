"""Kernel mutant: dK without the softmax scale.

Bug: dK = dS^T Q, where the logits were s Q K^T: the factor s = 1/sqrt(head_dim) is applied to
dQ and forgotten on dK. Symptom: the forward and dQ are exact; dK is 1/s = sqrt(head_dim) times
too large. Caught by: ``reference`` (the key input's gradient).
"""

from __future__ import annotations

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "reference"


class DkWithoutScale(Kernel):
    def dk(self, ds, q, scale):
        return ds.transpose(-1, -2) @ q


KERNEL = kernel_function(DkWithoutScale(), "blhd", "dk_without_scale")
