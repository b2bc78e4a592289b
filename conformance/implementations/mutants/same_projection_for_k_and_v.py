"""Mutant: the key projection used for the values.

Bug: ``v = self.k_proj(value)``, a copy-paste slip. Symptom: output matches the reference with
W_v = W_k.
Caught by: ``reference``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "reference"


class SameProjectionForKAndV(TextbookAttention):
    def project(self, query, key, value):
        return self.q_proj(query), self.k_proj(key), self.k_proj(value)


IMPLEMENTATION = declare("mutant-same-projection-for-k-and-v", SameProjectionForKAndV,
                         description="the key projection used for the values")
