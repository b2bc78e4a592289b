"""Mutant: a causal attention whose heads are merged with reshape and no transpose.

Bug: ``out.reshape(B, L, H * Dh)`` straight from (B, H, L, Dh), in a decoder's causal layer
(the same mistake as ``mutant-heads-merged-without-transpose``, for an assignment of causal
attention: a rubric's self-test pairs mutants with targets of their causality). Symptom: the
output is not the per-head attentions concatenated; rows mix positions, so a row sees later
ones.
Caught by: ``head_split``.
"""

from __future__ import annotations

from conformance.implementations.mutants.heads_merged_without_transpose import (
    HeadsMergedWithoutTranspose,
)
from conformance.implementations.mutants.textbook import declare

CATCHES = "head_split"


class CausalHeadsMergedWithoutTranspose(HeadsMergedWithoutTranspose):
    """The class of its own a user would check (``FILE::CausalHeadsMergedWithoutTranspose``)."""


IMPLEMENTATION = declare("mutant-causal-heads-merged-without-transpose",
                         CausalHeadsMergedWithoutTranspose, causal=True,
                         description="causal, and heads merged with reshape and no transpose")
