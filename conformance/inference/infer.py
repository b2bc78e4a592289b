"""Infer an implementation's declaration from the class itself, stating every inference.

:func:`infer` settles how to build and call the class (a :class:`Plan`), then drives the steps in
order (:mod:`conformance.inference.steps`: ``construction``, ``behaviour``, ``position``,
``features``), each ``step(inquiry)`` on one :class:`~conformance.inference.inquiry.Inquiry`:
reading what earlier steps found and setting what it finds in its
:class:`~conformance.inference.found.CapabilitiesFound` (typed: a capability's field, checked by
name), and stating what it inferred in its notes."""

from __future__ import annotations

import inspect
from dataclasses import replace

from torch import nn

from conformance.generation.constraints import discover
from conformance.inference.calls.packed_call import settle_call
from conformance.inference.calls.variadic_call import settle_by_trial
from conformance.inference.construction.build_and_call import (
    build_constraint,
    constructor_roles,
    encoding_constraint,
    forward_convention,
    layout_constraint,
    output_form,
    positional_arguments,
    probe_sizes,
    sequence_order,
)
from conformance.inference.construction.fixed_length import fixed_length
from conformance.inference.construction.fixed_sizes import (
    core_heads,
    fixed_width,
    hidden_heads,
    width_constraint,
)
from conformance.inference.construction.longest_length import longest_length
from conformance.inference.construction.named_roles import confirm_context, confirm_sizes
from conformance.inference.construction.trial import fill_by_trial
from conformance.inference.found import CapabilitiesFound
from conformance.inference.inquiry import Inquiry
from conformance.inference.names.roles import ConstructorRoles
from conformance.inference.observing.probe_length import fixed_probe_length
from conformance.inference.plan import InferenceError, Inferred, Plan, declarations_read
from conformance.inference.steps.behaviour import causality, dropout_form, dtypes_form, find_weights
from conformance.inference.steps.features import (
    cache_form,
    chunk_form,
    mask_form,
    packed_form,
    window_form,
)
from conformance.inference.steps.latent import latent_form
from conformance.inference.steps.normaliser import normaliser_form
from conformance.inference.steps.paths import path_form
from conformance.inference.steps.position import alibi_counting, encoding_inside, position_input
from conformance.inference.steps.scale import keep_scale, logit_scale
from conformance.inference.steps.settings import constructor_settings
from conformance.inference.steps.state import plain_state, position_state
from conformance.model.declarations import Declarations
from conformance.model.remedies import Note, Topic, as_notes
from conformance.numerics.threads import one_thread


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
    roles, config = ((ConstructorRoles(), None) if instance is not None
                     else constructor_roles(cls, declared, label))
    convention = forward_convention(cls, declared, label)
    init = dict(declared.init or ())
    if declared.causal in ("always", "never") and roles.causal and roles.causal not in init:
        init[roles.causal] = declared.causal == "always"  # declared causal: built causal
    plan = Plan(cls, roles, convention, init=tuple(init.items()),
                positional=positional_arguments(roles, declared, label), instance=instance,
                config_argument=config)
    called: list[str | Note] = []
    filled: list[str] = []
    if roles.width is None and roles.unknown and convention.inputs:  # a width by trial first
        plan, filled = fill_by_trial(plan, label)
    if plan.roles.width is None:  # an instance, or a constructor no argument sets a width of
        plan.fixed_width = fixed_width(plan, label)
        called.append(_width_note(plan, instance is not None))
    if not convention.inputs:  # *args / **kwargs, nothing named: how to call it, by trial
        convention, note = settle_by_trial(plan, label)
        plan = replace(plan, convention=convention)
        called.append(note)
    plan, more = fill_by_trial(plan, label)
    filled += more
    if roles.context is not None and plan.roles.context == roles.context:  # named, not tried
        plan, confirmed = confirm_context(plan)
        filled += confirmed
    settled: list[str | Note] = []
    settle_call(plan, label, settled)
    one_length = fixed_length(plan)
    if one_length is not None:
        settled.append(one_length)
    settled += confirm_sizes(plan, roles, declared.width_arg, label)
    with fixed_probe_length(plan.length):
        return _explored(plan, label, declared, init, [*called, *settled, *filled])


def _width_note(plan: Plan, instance: bool) -> str:
    """What was found of the width of a module no constructor argument sets one of."""
    if instance:
        return (f"an instance, checked as it is (deep copies of it: never rebuilt, never "
                f"changed): it takes inputs {plan.fixed_width} wide (found by trial)")
    if plan.fixed_width is None:
        return ("no parameters and no width argument: it takes inputs of any width (found by "
                "trial), checked as one head of that width")
    if any(getattr(plan.roles, role) for role in ("heads", "head_dim", "output")):
        return (f"no constructor argument sets the width: the module fixes it at "
                f"{plan.fixed_width} (its parameters take inputs {plan.fixed_width} wide, found "
                "by trial: a global or a fixed in_features)")
    return (f"constructor takes no width argument: built with no arguments, it takes inputs "
            f"{plan.fixed_width} wide (found by trial)")


def _explored(plan: Plan, label: str, declared: Declarations, init: dict[str, object],
              said: list[str | Note]) -> Inferred:
    """Everything inference finds once the class builds and is called as settled."""
    cls = plan.cls
    notes: list[str | Note] = [
        Note(plan.convention.describe(), topic=Topic.CALL),
        *(["cross-attention assumed from its separate q, k, v"] if plan.convention.call == "qkv"
          else []),
        Note(plan.roles.describe(), topic=Topic.CONSTRUCTOR),
        *([] if plan.roles.heads else
          ["single head (no head-count argument), unless its weights show more"]),
        *said]
    if plan.config_argument is not None:
        notes.append(Note(plan.config_argument.describe(), topic=Topic.CONSTRUCTOR))
    if plan.positional:
        notes.append(Note(f"constructed positionally: {cls.__name__}("
                          f"{', '.join(plan.positional)}) (declared)", topic=Topic.CONSTRUCTOR))
    if init:
        notes.append(Note("constructed with " + ", ".join(f"{k}={v!r}" for k, v in init.items())
                          + " (declared)", topic=Topic.CONSTRUCTOR))
    inquiry = Inquiry(plan, label, declared, CapabilitiesFound(), notes)
    build_constraint(inquiry)
    probe_sizes(inquiry)
    with declarations_read():
        returns = declared.choice("returns", ("tensor", "tuple"))
        padded = declared.choice("padded_queries", ("zero", "self", "any"))
    output_form(inquiry)
    if plan.queries is not None:  # found by calling it: the convention said first is its own
        notes[0] = Note(plan.convention.describe(), topic=Topic.CALL)
    inquiry.capabilities.set(shapes=inquiry.constraint.pairs if inquiry.constraint else None,
                             returns_tensor=returns == "tensor", padded_queries=padded)
    if padded is not None:
        notes.append(f"padded queries: {padded} (declared; checked by padding)")
    with declarations_read():
        position_input(inquiry)
    if plan.queries is not None:  # queries of its own: no weights, nothing causal, no cache
        latent_form(inquiry)
        return _inferred(inquiry)
    sequence_order(inquiry)
    inquiry.probe = inquiry.build()
    for step in (longest_length, causality, plain_state, position_state, logit_scale,
                 weights_and_heads,
                 layout_constraint, encoding_constraint):
        step(inquiry)
    inquiry.capabilities.set(shapes=inquiry.constraint.pairs if inquiry.constraint else None)
    with declarations_read():
        for step in (encoding_inside, keep_scale, window_form, chunk_form, cache_form,
                     dropout_form, mask_form, alibi_counting, packed_form, path_form,
                     normaliser_form, constructor_settings):
            step(inquiry)
    return _inferred(inquiry)


def weights_and_heads(inquiry: Inquiry) -> None:
    """The weight step (:func:`find_weights`), and where its weights reproduce nothing with one
    head and no argument sets the count, the head count the module fixes itself (then the
    probes' sizes at it); what it says follows what was said before it."""
    weighed = replace(inquiry, notes=[])
    find_weights(weighed)
    if (not inquiry.plan.roles.heads and not weighed.outcome.reproduced
            and not inquiry.declared.weights):
        found = hidden_heads(inquiry)
        if found is not None:
            heads_found, weighed = found
            weighed.notes.insert(0, f"{heads_found} heads, fixed by the module: its output is "
                                    f"reproduced with {heads_found} heads, not one (found by "
                                    "behaviour)")
            inquiry.constraint = weighed.constraint
            probe_sizes(inquiry)
        elif (seen := core_heads(inquiry)) is not None and seen > 1 and _at_heads(inquiry, seen):
            weighed = replace(inquiry, notes=[f"{seen} heads, fixed by the module: its attention "
                                              f"core computes {seen} maps per sequence "
                                              "(observed inside its forward)"])
            find_weights(weighed)
    inquiry.notes += weighed.notes
    inquiry.layout, inquiry.outcome = weighed.layout, weighed.outcome


def _at_heads(inquiry: Inquiry, heads: int) -> bool:
    """Whether the module builds at ``heads`` heads; if so, ``inquiry``'s configurations and
    probes are set to them."""
    plan = inquiry.plan
    if plan.fixed_width is not None and plan.fixed_width % heads:
        return False
    previous = plan.fixed_heads
    plan.fixed_heads = heads
    try:
        constraint = (width_constraint(plan) if plan.fixed_width is not None
                      else discover(plan.builds, heads=heads))
    except ValueError:  # builds for no width at this count
        plan.fixed_heads = previous
        return False
    inquiry.constraint = constraint
    probe_sizes(inquiry)
    return True


def _inferred(inquiry: Inquiry) -> Inferred:
    """The declaration found: the dtypes settled last, every note said."""
    dtypes_form(inquiry)
    said = as_notes(inquiry.notes)
    implementation = replace(inquiry.plan.implementation(inquiry.label, **inquiry.capabilities.given()),
                             weight_layout=inquiry.layout, notes=said)
    return Inferred(implementation, said)
