"""What the attention core observed inside a forward says of a causal failure, where no weight
layout maps the layer (no reference to match), told before the behavioural pattern of which rows
each position moves, which can't tell these from a causal mask that is not applied: a softmax
over the queries, and a future that leaks around weights that never reach it (the causal
check's alone: another check's failure to be causal, a cache's, is no change of later inputs):
:func:`core_hint`."""

from __future__ import annotations

from dataclasses import replace

from conformance.checks.core_route import observe
from conformance.checks.diagnosis import Bug
from conformance.checks.invariants.base import CheckContext
from conformance.checks.invariants.verify import reference_applies
from conformance.generation.cases import Case
from conformance.inference.observing.attention_probe import ProbeUnfit, measure_attention
from conformance.model.core import unweighted_future
from conformance.model.results import Hint
from conformance.subject.boundary import ImplementationError, Inputs

QUERY_AXIS_IN_CORE = Hint("the attention core observed in its forward normalises its softmax over "
                          "another axis than the keys (over the queries: dim=-2 where -1 is "
                          "meant): each key's weights are normalised over every query, later ones "
                          "included, so a row changes with later positions: softmax over the "
                          "wrong dimension?", Bug.SOFTMAX_OVER_QUERIES.value)
"""QUERY_AXIS where no weight layout maps the layer (no reference to match): seen at its core."""


LEAK = Hint("its attention weights on every later key are exactly 0 (observed inside its "
            "forward), yet the output moves with later inputs: the future leaks around the "
            "weights (a gate, a convolution or a normalisation over positions that reads later "
            "tokens?)", Bug.LEAK_AROUND_WEIGHTS.value)
"""Where a layer causal by structure (inference's finding) fails: what reads the future is no
weight of its attention."""


def core_hint(context: CheckContext, case: Case, inputs: Inputs, *, leaks: bool) -> Hint | None:
    """The likely bug the core shows on ``inputs``, from one observation: QUERY_AXIS_IN_CORE where
    no weight layout maps the layer (the reference says more where one does) and a softmax
    normalises over another axis than the keys (what row_stochastic finds there too); else,
    where ``leaks`` is asked (the causal check's own failure), LEAK where every softmax
    normalises over the keys and no weight reaches a later key. None otherwise, and nothing is
    observed where neither can be said."""
    axis = not reference_applies(context.capabilities)
    if not (axis or leaks):
        return None
    seen = observe(context.build(case), inputs, case)
    if axis and any(site.over_keys is False for site in seen.sites):
        return QUERY_AXIS_IN_CORE
    if not seen.sites and leaks and context.capabilities.weights:
        # No softmax to observe (a stick-breaking product, a sigmoid): read through its weights.
        # Heads as wide as the keys, where the case's are narrower: the probe reads one key a
        # feature.
        wide = case if case.head_dim > case.kv_len else replace(case, head_dim=case.kv_len + 1)
        try:
            weights = measure_attention(context.build(wide), wide, context.capabilities.call,
                                        causal=wide.causal)
        except (ProbeUnfit, ImplementationError):
            return None
        return LEAK if unweighted_future(weights) else None
    over_keys = all(site.over_keys is not False for site in seen.sites)
    return LEAK if leaks and over_keys and seen.causal_weights() else None
