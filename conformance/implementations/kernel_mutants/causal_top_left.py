"""Kernel mutant: causality aligned top-left where its documentation says bottom-right.

Bug: the causal mask (and window) is ``tril(0)`` on the (Lq, Lk) logits, FlashAttention < 2.1's
alignment, in a kernel documented (and so declared: ``DECLARE``) as FlashAttention >= 2.1's
bottom-right.
Symptom: exact with as many queries as keys; in decoding (one query over the cache) the query
sees the first key alone. Caught by: ``kernel``, given the declaration (measured alone, the
alignment is stated, not failed: which one is meant only its author can say).
"""

from __future__ import annotations

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "kernel"
DECLARE = {"causal_alignment": "bottom-right"}
"""What its documentation states, as a user declares it."""
EXPOSED_BY = {"causal": True}
"""The arguments under which it differs from the correct kernel (with fewer queries than keys)."""


class CausalTopLeft(Kernel):
    def visible(self, q_len, start, stop, kv_len, options, device):
        # The diagonal (and the window around it) at offset 0, as if the queries came first.
        return super().visible(q_len, start, stop, q_len, options, device)


KERNEL = kernel_function(CausalTopLeft(), "bhld", "causal_top_left")
