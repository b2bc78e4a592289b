"""Kernel mutant: an explicit softmax_scale is accepted and ignored.

Bug: the scale is computed as ``1 / sqrt(head_dim)`` whatever ``softmax_scale`` says (the
argument kept for FlashAttention's signature, never read). Symptom: exact at the default scale,
which every other check uses; given ``softmax_scale=0.25``, the output is still the default's.
Caught by: ``kernel`` (the scale given is not the scale applied, and it says the value is
ignored).
"""

from __future__ import annotations

import math

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "kernel"
EXPOSED_BY = {"softmax_scale": 0.05}
"""The arguments under which it differs from the correct kernel (with fewer queries than keys)."""

_attention = kernel_function(Kernel(), "blhd", "softmax_scale_ignored")


def softmax_scale_ignored(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1),
                          softcap=0.0, return_lse=False):
    return _attention(q, k, v, causal=causal, softmax_scale=1 / math.sqrt(q.shape[-1]),
                      window_size=window_size, softcap=softcap, return_lse=return_lse)


softmax_scale_ignored.layout = "blhd"
KERNEL = softmax_scale_ignored
