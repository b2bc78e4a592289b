"""Mutant: no causal mask once a cache is attached.

Bug: ``if use_cache: mask = None`` (generation feeds one token at a time, "nothing to mask"):
the prefill of a prompt through the cache then runs without the causal mask, and so does a
chunk of several new tokens. Symptom: the plain forward is right; with ``use_cache=True`` prefill
rows see later prompt tokens. Caught by: ``kv_cache``.
"""

from __future__ import annotations

from conformance.implementations.modern import LlamaAttention
from conformance.implementations.modern_declared import declare_llama

CATCHES = "kv_cache"


class CachePrefillUnmasked(LlamaAttention):
    def causal_with_cache(self, use_cache):
        return not use_cache


IMPLEMENTATION = declare_llama("mutant-cache-prefill-unmasked", CachePrefillUnmasked,
                               benchmark=False,
                               description="causal mask dropped when use_cache=True")
