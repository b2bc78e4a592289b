"""Mutant: k and v reshaped with the query's length.

Bug: ``k.view(B, Lq, H, Dh)`` (seed 004's mistake): cross-attention with kv_len != q_len raises.
Symptom: the declared cross-attention fails.
Caught by: ``contract``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "contract"


class KvWithQLength(TextbookAttention):
    def project(self, query, key, value):
        self._query_length = query.shape[1]  # then used for k and v too: the bug
        return super().project(query, key, value)

    def split_heads(self, x, length):
        return super().split_heads(x, self._query_length)


IMPLEMENTATION = declare("mutant-kv-with-q-length", KvWithQLength,
                         description="k and v reshaped with the query's length")
