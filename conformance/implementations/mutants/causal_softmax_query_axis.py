"""Mutant: a causal attention whose softmax runs over the query axis.

Bug: ``torch.softmax(scores, dim=-2)`` in a decoder's causal layer (the same mistake as
``mutant-softmax-query-axis``, for an assignment of causal attention: a rubric's self-test pairs
mutants with targets of their causality). Each key's column is normalised over the queries that
may see it, later ones included. Symptom: attention rows don't sum to 1; a row changes with
later positions although the mask is right.
Caught by: ``row_stochastic``.

Its causal mask is aligned bottom-right (the last query sees every key, as with a KV cache), so
every key's column has a query that sees it: the columns the query-axis softmax normalises are
never empty (top-left, with fewer queries than keys, a key no query sees would make a column of
-inf alone, NaN: a second symptom of the one bug, shown only to cross-length cases).
"""

from __future__ import annotations

import torch

from conformance.implementations.mutants.softmax_query_axis import SoftmaxOverQueries
from conformance.implementations.mutants.textbook import declare

CATCHES = "row_stochastic"


class CausalSoftmaxOverQueries(SoftmaxOverQueries):
    def future(self, q_len: int, kv_len: int, device: torch.device) -> torch.Tensor:
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=device).triu(
            diagonal=kv_len - q_len + 1)


IMPLEMENTATION = declare("mutant-causal-softmax-query-axis", CausalSoftmaxOverQueries, causal=True,
                         description="causal, and softmax over the query axis (dim=-2)")
