"""Mutant: ``is_causal=True`` handed to SDPA with a KV cache (pytorch #144858).

Bug: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` aligns its causal mask top-left:
with a cache, a decode call has fewer queries than keys (Lq < Lk), so query row i sees keys
0 .. i instead of 0 .. Lk - Lq + i. Symptom: the prefill is right (Lq == Lk); every one-token
decode step attends to key 0 alone and returns the first token's output. Caught by:
``kv_cache``.
"""

from __future__ import annotations

import torch.nn.functional as F

from conformance.implementations.modern import MetaLlamaAttention
from conformance.implementations.modern_declared import declare_buffered

CATCHES = "kv_cache"


class CacheCausalTopLeft(MetaLlamaAttention):
    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


IMPLEMENTATION = declare_buffered("mutant-cache-causal-top-left", CacheCausalTopLeft,
                                  description="SDPA is_causal=True with a KV cache (top-left)")
