"""Mutant: key projection detached from the graph.

Bug: ``self.k_proj(key).detach()``: the key projection never learns.
Symptom: k_proj's parameters receive no gradient.
Caught by: ``autograd``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "autograd"


class DetachedProjection(TextbookAttention):
    def project(self, query, key, value):
        return self.q_proj(query), self.k_proj(key).detach(), self.v_proj(value)


IMPLEMENTATION = declare("mutant-detached-projection", DetachedProjection,
                         description="key projection detached from the graph")
