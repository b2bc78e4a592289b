"""Queries of the module's own (Perceiver's learned latents), found by behaviour, and what
inference settles for such a layer.

A layer whose output keeps the same number of rows for inputs of two lengths attends from
queries it holds itself: ``f(x[, mask])`` with keys and values from ``x`` and one output row per
query (the ``latent`` call). No query is a token, so nothing about it can be causal, and no
per-head projection of ``x`` reproduces its queries: no weight layout is searched, and the
checks that need one judge it through its attention core. What is left to observe is the mask it
takes over ``x``, whether its output depends on the order of ``x``'s tokens, and dropout.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.generation.cases import own_queries
from conformance.inference.inquiry import Inquiry
from conformance.inference.observing.probing import probe_case
from conformance.inference.plan import InferenceError, Plan, first_call
from conformance.inference.steps.behaviour import dropout_form
from conformance.inference.steps.features import mask_form
from conformance.model.remedies import Note, Remedy
from conformance.model.spec import Config
from conformance.numerics.tolerance import abs_error, reordering_tolerance
from conformance.subject.boundary import ImplementationError

LONGER = 3
"""Tokens added for the second call: a module whose output keeps its row count across two input
lengths holds its queries itself."""


def own_query_count(plan: Plan, config: Config, first: object) -> int | None:
    """The output's row count where it stays the same for inputs of another length (queries the
    module holds itself), else None."""
    if (not isinstance(first, torch.Tensor) or first.dim() != 3 or plan.convention.call != "self"
            or first.shape[0] != config.batch):  # (length, batch, width) is transposed, not this
        return None
    longer = replace(config, q_len=config.q_len + LONGER, kv_len=config.kv_len + LONGER)
    try:
        other = first_call(plan, longer)
    except Exception:  # the longer call's own failure: no evidence either way
        return None
    other = other[0] if isinstance(other, tuple) else other
    rows = first.shape[1]
    same = isinstance(other, torch.Tensor) and other.dim() == 3 and other.shape[1] == rows
    return rows if same and rows != config.q_len else None


def latent_form(inquiry: Inquiry) -> None:
    """What inference settles for a layer with ``plan.queries`` queries of its own: not causal,
    its mask (probed over ``x``'s tokens), whether the order of ``x`` matters, dropout."""
    plan, declared = inquiry.plan, inquiry.declared
    if declared.causal not in (None, "never"):
        raise InferenceError(f"causal={declared.causal} is declared, but its queries are its own "
                             f"({plan.queries} learned rows, whatever the input's length): no "
                             "query is a position, so nothing in it can be causal")
    if declared.weights:
        raise InferenceError("a weight layout is declared, but its queries are its own (learned "
                             "rows, not a projection of the input): no layout maps them; leave "
                             "weights out and the checks judge it through its attention core")
    inquiry.capabilities.set(call="latent", queries=plan.queries, cross_attention=True,
                             causality={"kind": "never"})
    inquiry.notes.append(Note(f"its queries are its own: {plan.queries} output rows for inputs of any "
                      "length (learned latents, Perceiver-style; found by behaviour): x gives the "
                      "keys and values, nothing is causal, and the checks that need a weight "
                      "layout judge it through its attention core",
                      Remedy.to("call", "latent", "state it")))
    mask_form(inquiry)
    _order(inquiry)
    inquiry.probe = inquiry.build()
    dropout_form(inquiry)


def _order(inquiry: Inquiry) -> None:
    """Whether permuting ``x``'s tokens changes the output (positions inside): checked as
    position-free only where it does not."""
    capabilities, notes = inquiry.capabilities, inquiry.notes
    case = own_queries(probe_case(inquiry.heads, inquiry.head_dim, kept=None, dtype="float64"),
                       capabilities.caps)
    inputs = case.inputs("latent")
    order = torch.arange(case.kv_len).roll(1)
    try:
        instance = inquiry.build()
        output = instance.forward(inputs)
        moved = instance.forward(inputs.with_tensors(inputs.query, inputs.key[:, order]))
    except ImplementationError:
        return  # the checks report a failing call
    change = float(abs_error(moved, output, nan_equal=True).max())
    if change > reordering_tolerance(output.dtype, output):
        capabilities.set(position={"positional": "positions of x's tokens (probed: reordering "
                                                 f"them changes the output, by {change:.3g})"})
        notes.append("its output depends on the order of x's tokens (probed: reordering them "
                     f"changes it by {change:.3g}): checked as position-dependent")
