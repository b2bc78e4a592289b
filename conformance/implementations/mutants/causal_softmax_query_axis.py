"""Mutant: a causal attention whose softmax runs over the query axis.

Bug: ``torch.softmax(scores, dim=-2)`` in a decoder's causal layer (the same mistake as
``mutant-softmax-query-axis``, for an assignment of causal attention: a rubric's self-test pairs
mutants with targets of their causality). Each key's column is normalised over the queries that
may see it, later ones included. Symptom: attention rows don't sum to 1; a row changes with
later positions although the mask is right.
Caught by: ``row_stochastic``.
"""

from __future__ import annotations

from conformance.implementations.mutants.softmax_query_axis import SoftmaxOverQueries
from conformance.implementations.mutants.textbook import declare

CATCHES = "row_stochastic"

IMPLEMENTATION = declare("mutant-causal-softmax-query-axis", SoftmaxOverQueries, causal=True,
                         description="causal, and softmax over the query axis (dim=-2)")
