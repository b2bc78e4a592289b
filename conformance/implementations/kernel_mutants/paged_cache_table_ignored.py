"""Kernel mutant: a paged KV cache read without its block table.

Bug: token t of element b is read from page ``b * n + t // page`` (the pages taken in order),
where the block table says which page holds it (vLLM's and FlashAttention's paged caches hand
pages out in any order); the writes follow the table. Symptom: exact with contiguous caches and
wherever the pages happen to be handed out in order; with a shuffled table each element reads
pages another element wrote. Caught by: ``kv_cache`` (the suite's paged caches hand their pages
out shuffled).
"""

from __future__ import annotations

import torch

from conformance.implementations.kernels import Kernel, cache_kernel_function

CATCHES = "kv_cache"


class PagedCacheTableIgnored(Kernel):
    def cached(self, k_cache, v_cache, k, v, held, block_table=None):
        if block_table is None:
            return super().cached(k_cache, v_cache, k, v, held, block_table)
        super().cached(k_cache, v_cache, k, v, held, block_table)  # the writes, by the table
        in_order = torch.arange(block_table.numel(), dtype=block_table.dtype,
                                device=block_table.device).reshape(block_table.shape)
        return super().cached(k_cache, v_cache, None, None,
                              [n + (0 if k is None else k.shape[1]) for n in held], in_order)


KERNEL = cache_kernel_function(PagedCacheTableIgnored(), "paged_cache_table_ignored")
