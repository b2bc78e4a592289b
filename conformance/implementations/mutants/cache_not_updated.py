"""Mutant: the KV cache not updated after the prefill.

Bug: the present cache handed back is the past one when there was one (``present = past or
(k, v)``): the decode call attends to the new token, but never stores it. Symptom: the prefill
and the first decode step are right; from the second step on, the previously decoded tokens are
missing from the keys. Caught by: ``kv_cache``.
"""

from __future__ import annotations

from conformance.implementations.modern import LlamaAttention
from conformance.implementations.modern_declared import declare_llama

CATCHES = "kv_cache"


class CacheNotUpdated(LlamaAttention):
    def present(self, past, present):
        return past if past is not None else present


IMPLEMENTATION = declare_llama("mutant-cache-not-updated", CacheNotUpdated, benchmark=False,
                               description="decode calls return the past cache unchanged")
