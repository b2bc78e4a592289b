"""Mutant: causal mask that also hides the current token.

Bug: ``triu(diagonal=0)`` instead of ``diagonal=1``: row t sees only positions < t, and row 0
sees nothing (NaN with a -inf fill). Symptom: over-masking. Caught by: ``causal``.
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "causal"


class HidesCurrentToken(TextbookAttention):
    def future(self, q_len, kv_len, device):
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).triu(diagonal=0)


IMPLEMENTATION = declare("mutant-causal-hides-current-token", HidesCurrentToken, causal=True,
                         description="causal mask triu(diagonal=0): row t cannot see itself")
