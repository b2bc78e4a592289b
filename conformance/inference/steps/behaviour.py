"""Inference steps about what the module does: its weights (declared or found by behaviour),
causality, dropout, the dtypes it is checked in."""

from __future__ import annotations

import torch

import conformance.inference.weights.weight_roles as weight_roles
from conformance.generation.cases import dtype_name, own_queries
from conformance.inference.inquiry import Inquiry
from conformance.inference.names.roles import CONTEXT_LENGTH
from conformance.inference.observing.probing import (
    causal_by_structure,
    is_causal,
    probe_case,
    sees_only_later,
)
from conformance.inference.plan import InferenceError, declarations_read
from conformance.inference.weights.weight_roles import WeightOutcome
from conformance.model.remedies import Note, Remedy
from conformance.model.spec import Config
from conformance.subject.boundary import ImplementationError
from conformance.subject.in_process import ModuleInstance


def find_weights(inquiry: Inquiry) -> None:
    """The weight layout (``inquiry.layout``): declared, or found by behaviour (see
    :mod:`conformance.inference.weights.weight_roles`, its ``inquiry.outcome``); and the key/value
    heads."""
    plan, declared, constraint = inquiry.plan, inquiry.declared, inquiry.constraint
    notes, capabilities = inquiry.notes, inquiry.capabilities
    if declared.weights:
        with declarations_read():
            layout = declared.weight_layout("inner")
        notes.append((layout.describe() if layout else "no weight access") + " (declared)")
        if plan.roles.kv_heads or plan.roles.kv_group:
            capabilities.set(kv_heads="config")
            notes.append(f"key/value heads = {plan.roles.kv_heads or plan.roles.kv_group}: "
                         "generated as divisors of num_heads")
        inquiry.layout, inquiry.outcome = layout, WeightOutcome()
        return

    def build_at(heads: int, head_dim: int, kv_heads: int | None) -> ModuleInstance:
        return inquiry.build(Config(batch=2, q_len=weight_roles.LENGTH, kv_len=weight_roles.LENGTH,
                                    d_model=heads * head_dim, num_heads=heads,
                                    num_kv_heads=kv_heads, dtype=torch.float64))

    with declarations_read():
        grouping = declared.choice("kv_grouping", ("interleaved", "tiled"))
        rope = declared.rotary()
        output = declared.choice("output_projection", ("applied",))
    outcome = weight_roles.find(
        build_at, plan.cls, plan.convention.call,
        causal=capabilities.caps.causality.kind == "always", single_head=not plan.roles.heads,
        kv_argument=plan.roles.kv_heads or plan.roles.kv_group,
        pairs=constraint.pairs if constraint else None,
        max_len=CONTEXT_LENGTH if plan.roles.context else None, notes=notes,
        grouping=grouping, rope=rope, output_applied=output == "applied",
        scale=inquiry.logit_scale)
    if outcome.kv_heads is not None:
        capabilities.set(kv_heads=outcome.kv_heads)
    if outcome.kv_doubt is not None:
        capabilities.doubt(kv_grouping=outcome.kv_doubt)
    if outcome.weights_doubt is not None:
        capabilities.doubt(weights=outcome.weights_doubt)
    if outcome.float32_parts:
        capabilities.set(float32_parts=tuple(outcome.float32_parts))
    if outcome.variant_doubt is not None:
        capabilities.doubt(variant=outcome.variant_doubt)
    if outcome.unmodelled is not None:
        capabilities.set(unmodelled=outcome.unmodelled)
    inquiry.layout, inquiry.outcome = outcome.layout, outcome


def causality(inquiry: Inquiry) -> None:
    plan, declared, capabilities, notes = (inquiry.plan, inquiry.declared, inquiry.capabilities,
                                           inquiry.notes)
    heads, head_dim = inquiry.heads, inquiry.head_dim
    if declared.causal:
        if declared.causal not in ("never", "always", "optional"):
            raise InferenceError(f"causal {declared.causal!r}: use never, always or optional")
        if declared.causal == "optional" and not plan.convention.causal:
            raise InferenceError("causal=optional, but forward has no is_causal/causal argument")
        capabilities.set(causality={"kind": declared.causal})
        if declared.causal == "optional":
            capabilities.set(causality={"argument": "is_causal"})
        notes.append(f"causal: {declared.causal} (declared)")
        return
    if plan.convention.causal:
        try:
            inquiry.build(causality={"kind": "optional", "argument": "is_causal"}).forward(
                probe_case(heads, head_dim, kept=None, causal=True).inputs(plan.convention.call))
        except ImplementationError as error:
            notes.append(f"{plan.convention.causal}=True raises ({error}): a hint, as in "
                         "nn.MultiheadAttention; causality not checked through it")
        else:
            capabilities.set(causality={"kind": "optional", "argument": "is_causal"})
            notes.append(f"causal when {plan.convention.causal}=True")
            return
    call = plan.convention.call
    try:
        instance, case = inquiry.build(), probe_case(heads, head_dim)
        found = next((said for measured, *said in CAUSAL_FINDINGS
                      if measured(instance, case, call)), None)
    except ImplementationError:
        notes.append("causality not probed: the unmasked call fails")
        capabilities.unprobed.add("causal")
        return
    if found is None:
        notes.append(Note(NOT_CAUSAL, Remedy.to("causal", "always", "say it is meant to be")))
        return
    words, otherwise = found
    capabilities.set(causality={"kind": "always"})
    notes.append(Note(words, Remedy.to("causal", "never", otherwise)))


NOT_CAUSAL = "not causal (probed: rows see later positions)"
"""The note of a layer none of CAUSAL_FINDINGS holds for (the normaliser step may take it back:
causal by structure, read through its weights)."""
STRUCTURE_NOTE = ("causal by structure (observed inside its forward: every attention weight on a "
                  "later key is exactly 0), though its output moves with later inputs: checked as "
                  "causal, where that leak fails")
STRUCTURE_OTHERWISE = "check it as an encoder, if the future is meant to reach it"
CAUSAL_FINDINGS = (
    (is_causal, "always causal (probed: rows ignore every later position)",
     "check it as an encoder, if it is meant not to be"),
    # Nobody means a row to see only the future: a triangle transposed.
    (sees_only_later, "causal, its mask transposed (probed: each row ignores every earlier "
     "position and sees the later ones, which only a causal triangle transposed does): "
     "checked as causal", "check it as an encoder, if it is meant to see the future"),
    # Weights that never reach the future, an output that moves with it: a leak around them.
    (causal_by_structure, STRUCTURE_NOTE, STRUCTURE_OTHERWISE),
)
"""What makes an undeclared layer checked as causal, measured in this order (the first that
holds): each measure, its note, and what declaring causal never would mean instead."""


def dropout_form(inquiry: Inquiry) -> None:
    """A dropout argument, or a rate it fixes itself: train-mode calls of ``inquiry.probe``
    that differ."""
    plan, capabilities, probe = inquiry.plan, inquiry.capabilities, inquiry.probe
    heads, head_dim, notes = inquiry.heads, inquiry.head_dim, inquiry.notes
    if plan.roles.dropout:
        capabilities.set(dropout="config")
        return
    inputs = own_queries(probe_case(heads, head_dim, kept=None), capabilities.caps).inputs(
        plan.convention.call)
    try:
        changes = not torch.equal(probe.forward(inputs, training=True, seed=1),
                                  probe.forward(inputs, training=True, seed=2))
    except ImplementationError:
        changes = False
    if changes:
        capabilities.set(dropout="fixed")
        notes.append("dropout at a rate it fixes itself (probed: train-mode calls differ)")


def dtypes_form(inquiry: Inquiry) -> None:
    declared, capabilities, notes = inquiry.declared, inquiry.capabilities, inquiry.notes
    with declarations_read():
        dtypes = declared.dtype_list()
    if dtypes is not None:
        capabilities.set(floats={"supported": dtypes, "assumed": ()})
        notes.append("dtypes " + ", ".join(dtype_name(d) for d in dtypes) + " (declared)")
    else:
        # Nobody declared float32 or float64 either: one it refuses is dropped, not failed.
        capabilities.set(floats={"probed": (torch.float32, torch.float64)})
        notes.append(Note("float16 and bfloat16 assumed (an nn.Module can be cast to them, "
                          "nobody declared them): what breaks there is a warning",
                          Remedy.to("dtypes", "float32,float64,float16,bfloat16",
                                    "make them part of its contract")))
