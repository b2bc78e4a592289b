"""Infer an implementation's declaration from the class itself, stating every inference.

:func:`infer` drives the steps in order (``construction``, ``behaviour``, ``position``,
``features``), each reading what earlier steps found and setting what it finds in a
:class:`~conformance.inference.found.CapabilitiesFound` (typed: a capability's field, checked by
name), and stating what it inferred in the notes."""

from __future__ import annotations

import inspect
from dataclasses import replace

from torch import nn

from conformance.inference.behaviour import causality, dropout_form, dtypes_form, find_weights
from conformance.inference.construction import (
    build_constraint,
    constructor_roles,
    encoding_constraint,
    forward_convention,
    layout_constraint,
    output_form,
    positional_arguments,
    probe_pair,
    sequence_order,
)
from conformance.inference.features import cache_form, mask_form, packed_form, window_form
from conformance.inference.fixed_sizes import fixed_width, hidden_heads
from conformance.inference.found import CapabilitiesFound
from conformance.inference.latent import latent_form
from conformance.inference.packed_call import settle_call
from conformance.inference.plan import InferenceError, Inferred, Plan
from conformance.inference.position import alibi_counting, encoding_inside, position_input
from conformance.inference.roles import ConstructorRoles
from conformance.inference.state import plain_state, position_state
from conformance.inference.trial import fill_by_trial
from conformance.inference.variadic_call import settle_by_trial
from conformance.model.declarations import DeclarationError, Declarations
from conformance.model.remedies import Note, as_notes
from conformance.model.spec import Config
from conformance.model.weights import WeightLayout
from conformance.numerics.threads import one_thread
from conformance.subject.in_process import InProcessSubject


@one_thread()  # its probes are tiny: threads only spin on a busy machine
def infer(cls: type, *, name: str | None = None, declared: Declarations | None = None,
          instance: nn.Module | None = None) -> Inferred:
    """Declaration for an ``nn.Module`` subclass: what ``declared`` says, the rest inferred.

    With ``instance`` (of ``cls``), that instance is checked as it is: every build is a deep
    copy of it, so its configuration (width, heads, key/value heads, ...) and its weights are
    the ones checked, found from what it computes as for a module that fixes its own sizes.
    Raises InferenceError naming what can't be inferred and the declaration that settles it.
    """
    declared = declared or Declarations()
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise InferenceError(f"{getattr(cls, '__name__', cls)!r} is not an nn.Module class (a "
                             "callable of another kind is registered with its capabilities "
                             "stated)")
    label = name or cls.__name__
    forward = inspect.getattr_static(cls, "forward", None)
    if forward is nn.Module.forward:
        raise InferenceError(f"{label} defines no forward method (nn.Module's own only raises "
                             "NotImplementedError): define def forward(self, x, ...)")
    if not callable(forward) and not isinstance(forward, (staticmethod, classmethod)):
        kind = "a property" if isinstance(forward, property) else type(forward).__name__
        raise InferenceError(f"{label}.forward is {kind}, not a method: define it as "
                             "def forward(self, x, ...)")
    roles = ConstructorRoles() if instance is not None else constructor_roles(cls, declared,
                                                                                label)
    convention = forward_convention(cls, declared, label)
    init = dict(declared.init or ())
    if declared.causal in ("always", "never") and roles.causal and roles.causal not in init:
        init[roles.causal] = declared.causal == "always"  # declared causal: built causal
    plan = Plan(cls, roles, convention, init=tuple(init.items()),
                positional=positional_arguments(roles, declared, label), instance=instance)
    called = []
    if roles.width is None:  # an instance, or a constructor that needs no arguments
        plan.fixed_width = fixed_width(plan, label)
        called.append(
            f"an instance, checked as it is (deep copies of it: never rebuilt, never changed): "
            f"it takes inputs {plan.fixed_width} wide (found by trial)" if instance is not None
            else f"constructor takes no width argument: built with no arguments, it takes "
                 f"inputs {plan.fixed_width} wide (found by trial)")
    if not convention.inputs:  # *args / **kwargs, nothing named: how to call it, by trial
        convention, note = settle_by_trial(plan, label)
        plan = replace(plan, convention=convention)
        called.append(note)
    plan, filled = fill_by_trial(plan, label)
    settled: list[str] = []
    settle_call(plan, label, settled)
    notes = [plan.convention.describe() + ("; cross-attention assumed from its separate q, k, v"
                                           if plan.convention.call == "qkv" else ""),
             plan.roles.describe() + ("" if plan.roles.heads
                                      else "; single head (no head-count argument), unless "
                                           "its weights show more"),
             *called, *settled, *filled]
    if plan.positional:
        notes.append(f"constructed positionally: {cls.__name__}({', '.join(plan.positional)}) "
                     "(declared)")
    if init:
        notes.append("constructed with " + ", ".join(f"{k}={v!r}" for k, v in init.items())
                     + " (declared)")
    constraint = build_constraint(plan, label, notes)
    heads, head_dim = probe_pair(plan, constraint)
    config = Config(batch=2, q_len=6, kv_len=6, d_model=heads * head_dim, num_heads=heads)
    try:
        returns = declared.choice("returns", ("tensor", "tuple"))
        padded = declared.choice("padded_queries", ("zero", "self", "any"))
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    output_form(plan, config, notes, returns)
    if plan.queries is not None:  # found by calling it: the convention said first is its own
        notes[0] = plan.convention.describe()
    capabilities = CapabilitiesFound(shapes=constraint.pairs if constraint else None,
                                     returns_tensor=returns == "tensor", padded_queries=padded)
    if padded is not None:
        notes.append(f"padded queries: {padded} (declared; checked by padding)")
    try:
        position_input(plan, declared, capabilities, notes)
    except DeclarationError as error:
        raise InferenceError(str(error)) from error

    def build(**changes: object):
        implementation = plan.implementation(label, **capabilities.given(**changes))
        return InProcessSubject(implementation).instantiate(config, seed=0)

    if plan.queries is not None:  # queries of its own: no weights, nothing causal, no cache
        latent_form(plan, declared, capabilities, build, heads, head_dim, notes)
        return _inferred(plan, label, declared, capabilities, None, notes)
    sequence_order(plan, declared, build, heads, head_dim, notes)
    probe = build()
    causality(plan, declared, capabilities, build, heads, head_dim, notes)
    plain_state(plan, capabilities, build, heads, head_dim, label)
    position_state(plan, capabilities, build, heads, head_dim, notes)
    weight_notes: list[str | Note] = []
    layout, outcome = find_weights(plan, declared, label, constraint, weight_notes, capabilities)
    if not plan.roles.heads and not outcome.reproduced and not declared.weights:
        found = hidden_heads(plan, declared, label, constraint, capabilities)
        if found is not None:
            heads_found, constraint, layout, outcome, weight_notes = found
            weight_notes.insert(0, f"{heads_found} heads, fixed by the module: its output is "
                                   f"reproduced with {heads_found} heads, not one (found by "
                                   "behaviour)")
            heads, head_dim = probe_pair(plan, constraint)
            config = Config(batch=2, q_len=6, kv_len=6, d_model=heads * head_dim,
                            num_heads=heads)
    notes += weight_notes
    constraint = layout_constraint(plan, layout, constraint, notes)
    constraint = encoding_constraint(plan, outcome, constraint, capabilities, notes)
    capabilities.set(shapes=constraint.pairs if constraint else None)
    try:
        encoding_inside(plan, declared, capabilities, probe, outcome, notes)
        window_form(plan, declared, capabilities, config, label, heads, head_dim, notes)
        cache_form(plan, declared, capabilities, build, heads, head_dim, notes)
        dropout_form(plan, capabilities, probe, heads, head_dim, notes)
        mask_form(plan, declared, capabilities, build, heads, head_dim, notes)
        alibi_counting(plan, capabilities, layout, label, heads, head_dim, notes)
        packed_form(plan, declared, capabilities, build, heads, head_dim, notes)
    except DeclarationError as error:
        raise InferenceError(str(error)) from error
    return _inferred(plan, label, declared, capabilities, layout, notes)


def _inferred(plan: Plan, label: str, declared: Declarations, capabilities: CapabilitiesFound,
              layout: WeightLayout | None, notes: list[str | Note]) -> Inferred:
    """The declaration found: the dtypes settled last, every note said."""
    dtypes_form(declared, capabilities, notes)
    said = as_notes(notes)
    implementation = replace(plan.implementation(label, **capabilities.given()), weight_layout=layout,
                             notes=said)
    return Inferred(implementation, said)
