"""Kernel mutant: the backward reads its cotangent as contiguous memory.

Bug: dO is read with the strides of a contiguous tensor of its shape (``as_strided``, as a
kernel indexing raw pointers does), whatever its real strides. FlashAttention once mis-read a
non-contiguous dout this way. Symptom: exact while dO is contiguous; where a model transposes the
output before its projection, dO is not, and every gradient reads the wrong elements. Caught by:
``reference`` (the suite hands the kernel's backward a non-contiguous dout).
"""

from __future__ import annotations

import torch

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "reference"


class DoutAssumedContiguous(Kernel):
    def read_dout(self, dout):
        strides = torch.empty(dout.shape, device="meta").stride()
        return dout.as_strided(dout.shape, strides).float()


KERNEL = kernel_function(DoutAssumedContiguous(), "bhld", "dout_assumed_contiguous")
