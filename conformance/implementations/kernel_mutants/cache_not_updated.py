"""Kernel mutant: the new keys and values attended to and never written into the cache.

Bug: each call attends over ``cat(k_cache[:cache_seqlens], k)`` and leaves the caches as they
were, where FlashAttention's ``flash_attn_with_kvcache`` writes ``k`` and ``v`` into them at
``cache_seqlens``. Symptom: every single call is exact (a prefill, a dense call); the next decode
step reads zeros where the earlier tokens' keys should be. Caught by: ``kv_cache`` (decoding
through the caches differs from the full forward, and it says a call reads a slot no call
wrote).
"""

from __future__ import annotations

import torch

from conformance.implementations.kernels import Kernel, cache_kernel_function

CATCHES = "kv_cache"


class CacheNotUpdated(Kernel):
    def cached(self, k_cache, v_cache, k, v, held, block_table=None):
        before = super().cached(k_cache, v_cache, None, None, held, block_table)  # reads only
        if k is None:
            return before
        return [(torch.cat([keys, k[b]]), torch.cat([values, v[b]]))
                for b, (keys, values) in enumerate(before)]


KERNEL = cache_kernel_function(CacheNotUpdated(), "cache_not_updated")
