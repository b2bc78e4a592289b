"""Mutant: the KV cache concatenated on the wrong axis.

Bug: ``torch.cat([past_k, k], dim=1)`` on (batch, heads, length, head_dim) tensors: the new keys
are appended as extra heads instead of extra positions (dim 1 is the sequence axis only in the
(batch, length, heads, head_dim) layout the code was copied from). Symptom: the first decode call
after a one-token prefill silently attends over twice the heads, the next raises a shape error.
Caught by: ``kv_cache``.
"""

from __future__ import annotations

import torch

from conformance.implementations.modern import LlamaAttention
from conformance.implementations.modern_declared import declare_llama

CATCHES = "kv_cache"


class CacheWrongAxis(LlamaAttention):
    def extend_cache(self, past, k, v):
        return torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)


IMPLEMENTATION = declare_llama("mutant-cache-wrong-axis", CacheWrongAxis, benchmark=False,
                               description="KV cache concatenated along the head axis")
