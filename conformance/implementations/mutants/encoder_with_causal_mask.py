"""Mutant: a causal mask in a module declared non-causal.

Bug: decoder code copied into an encoder keeps its causal mask. Symptom: output depends on the
order of the tokens.
Caught by: ``permutation``.
"""

from __future__ import annotations

from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "permutation"


class EncoderWithCausalMask(TextbookAttention):
    def __init__(self, d_model, num_heads, causal=False, dropout=0.0):
        super().__init__(d_model, num_heads, causal=True, dropout=dropout)


IMPLEMENTATION = declare("mutant-encoder-with-causal-mask", EncoderWithCausalMask,
                         description="a causal mask in a module declared non-causal")
