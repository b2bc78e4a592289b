"""Kernel mutant: the causal diagonal's offset taken the wrong way round.

Bug: the causal mask is ``tril(Lq - Lk)`` where bottom-right alignment is ``tril(Lk - Lq)``.
Symptom: exact when queries and keys are as many (every other check's causal case); with fewer
queries than keys the first Lk - Lq queries see no key at all and the others too few (decode's
single query sees nothing). Caught by: ``kernel`` (its alignment measures as neither, and
compared with bottom-right its rows are wrong).
"""

from __future__ import annotations

import torch

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "kernel"
EXPOSED_BY = {"causal": True}
"""The arguments under which it differs from the correct kernel (with fewer queries than keys)."""


class CausalOffsetReversed(Kernel):
    def visible(self, q_len, start, stop, kv_len, options, device):
        seen = super().visible(q_len, start, stop, kv_len, options, device)
        if options.causal:
            rows = torch.arange(q_len, device=device)[:, None]
            cols = torch.arange(start, stop, device=device)[None, :]
            seen = seen & (cols <= rows + (q_len - kv_len))
        return seen


KERNEL = kernel_function(CausalOffsetReversed(), "bhld", "causal_offset_reversed")
