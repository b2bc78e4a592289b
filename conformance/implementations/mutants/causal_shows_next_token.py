"""Mutant: causal mask that shows the next token.

Bug: ``triu(diagonal=2)`` instead of ``diagonal=1``: row t also sees position t + 1.
Symptom: changing a later input changes an earlier output row. Caught by: ``causal``.
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "causal"


class ShowsNextToken(TextbookAttention):
    def future(self, q_len, kv_len, device):
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).triu(diagonal=2)


IMPLEMENTATION = declare("mutant-causal-shows-next-token", ShowsNextToken, causal=True,
                         description="causal mask triu(diagonal=2): row t sees t + 1")
