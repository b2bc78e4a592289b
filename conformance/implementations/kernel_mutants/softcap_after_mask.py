"""Kernel mutant: the softcap applied after the mask.

Bug: the logits are masked with -inf first and capped after, ``c * tanh(-inf / c) = -c``: a
masked key's logit becomes -c instead of -inf. Symptom: exact without a softcap, and with one
where nothing is masked; with ``softcap=1`` and ``causal=True`` every query attends to the future
with weight e^-c / Z. Caught by: ``kernel``.
"""

from __future__ import annotations

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "kernel"
EXPOSED_BY = {"softcap": 1.0, "causal": True}
"""The arguments under which it differs from the correct kernel (with fewer queries than keys)."""


class SoftcapAfterMask(Kernel):
    def scores(self, q, k, options, start, kv_len):
        s = (q.float() @ k.float().transpose(-1, -2)) * options.scale
        seen = self.visible(q.shape[-2], start, start + k.shape[-2], kv_len, options, q.device)
        return self.capped(s.masked_fill(~seen, float("-inf")), options)


KERNEL = kernel_function(SoftcapAfterMask(), "blhd", "softcap_after_mask")
