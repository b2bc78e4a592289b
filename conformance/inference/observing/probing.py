"""Behaviour the signature can't tell: the mask convention, causality, sequence-first inputs.

Mask: every kind the argument's name admits (see :data:`~conformance.inference.names.convention.
MaskFamily`: int, bool and float 1/0 keep masks, bool ignore masks, additive masks with -inf and
with finfo.min) in every layout ((B, Lk) first, then (B, 1, 1, Lk), (B, Lq, Lk), (B, 1, Lq, Lk),
(B, H, Lq, Lk), (Lq, Lk) shared over the batch) is tried; for a causal module the layouts with a
query axis are tried also as the whole mask, the causal triangle folded in (HuggingFace's 4-D
masks, torchtune's). A convention is accepted when it has the properties that define a mask: a
mask that keeps every key changes nothing (so a mask that replaces causality is not taken for a
padding mask), masked keys are invisible (perturbing them changes no row) and kept keys are not
(perturbing them does). A call that raises (a shape or dtype the module does not take) prunes the
convention after one call. An accepted convention is confirmed on a second case whose batch
exceeds its length (a mask sliced as ``mask[:L, :L]`` or broadcast by coincidence works on one
shape only).

Conventions outside the family (the other boolean polarity) are tried after it. A name orders the
search, behaviour decides: a complement that has every property of a mask is accepted and
doubted (OpenNMT reads a ``mask`` True = masked, torchtune a ``padding_mask`` True = token), and
the doubt is reported as a warning: which polarity was meant is intent, which only a declaration
settles. When nothing works but a
convention runs on both shapes, keeps an all-keep mask harmless and only leaks (masked keys
still change the output), it is assumed, and ``padding`` fails with the leak and its
counterexample; when none even does that, no convention is declared: the caller reports the
problem once (``padding`` fails with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from conformance.errors import clipped
from conformance.generation.cases import Case
from conformance.inference.observing.probe_length import fitted
from conformance.model.mask_forms import (
    LAYOUT_SHAPES,
    QUERY_AXIS_LAYOUTS,
    MaskConvention,
    MaskKind,
    MaskLayout,
    right_padded,
)
from conformance.numerics.tolerance import abs_error, only_rows, reordering_tolerance, unchanged_tolerance
from conformance.subject.boundary import CapabilityError, ImplementationError, Instance

K, L = MaskKind, MaskLayout

KINDS = {
    "keep": (K.KEEP_INT, K.KEEP_BOOL, K.KEEP_FLOAT, K.ADDITIVE_MIN, K.ADDITIVE),
    "ignore": (K.IGNORE_BOOL, K.ADDITIVE_MIN, K.ADDITIVE),
    "either": (K.KEEP_BOOL, K.IGNORE_BOOL, K.ADDITIVE_MIN, K.ADDITIVE, K.KEEP_INT, K.KEEP_FLOAT),
    "additive": (K.ADDITIVE_MIN, K.ADDITIVE),
    "lengths": (K.LENGTHS,),
}
"""Kinds each family admits, in the order tried (the first that works is declared). Additive
masks are tried with finfo.min first: it is what HuggingFace builds, and modules that add their
own finfo.min (a causal fill) on top of a mask mix -inf and finite fills otherwise."""

LAYOUTS = {
    "keep": (L.KEY_PADDING, L.BROADCAST, L.PER_QUERY_BROADCAST, L.PER_QUERY, L.PER_HEAD,
             L.SHARED),
    "ignore": (L.KEY_PADDING, L.BROADCAST, L.PER_QUERY, L.PER_QUERY_BROADCAST, L.PER_HEAD,
               L.SHARED),
    "either": (L.KEY_PADDING, L.SHARED, L.PER_QUERY, L.BROADCAST, L.PER_QUERY_BROADCAST,
               L.PER_HEAD),
    "additive": (L.KEY_PADDING, L.BROADCAST, L.PER_QUERY_BROADCAST, L.PER_HEAD, L.PER_QUERY,
                 L.SHARED),
    "lengths": (L.PER_SEQUENCE, L.PER_ROW),
}
"""Layouts each family admits, in the order tried: of the conventions that work, (B, Lk) key
padding is preferred, then the broadcast and per-query layouts."""

SHOWN_FORMS = 2
"""Forms that ran with another meaning than the accepted one, said one by one (more: counted)."""

LEAK = "masked keys still change the output"
ALL_KEEP = "a mask that keeps every key changes the output"

COMPLEMENT = {"keep": (K.IGNORE_BOOL,), "ignore": (K.KEEP_BOOL, K.KEEP_INT)}
"""Kinds of the opposite polarity: tried only to recognise an inverted mask."""

BOOLEAN_POLARITY = {K.KEEP_BOOL: "True = attend (F.scaled_dot_product_attention's meaning)",
                    K.IGNORE_BOOL: "True = masked (nn.MultiheadAttention's meaning)"}


def probe_case(num_heads: int, head_dim: int = 4, **changes: object) -> Case:
    """The probes' small case: batch 2, length 6; element 0 keeps 3 keys, element 1 keeps 4.

    The kept keys are scattered, key 0 always among them and a masked key before a kept one in
    every element: under causality, right padding would hide masked keys from every kept row
    whatever the mask does, and prove nothing."""
    return fitted(replace(Case(batch=2, q_len=6, kv_len=6, num_heads=num_heads,
                               head_dim=head_dim, seed=3, kept=(3, 4), mask_seed=2), **changes))


def confirming_case(case: Case) -> Case:
    """Another shape for the same module: batch 5 over length 4, every element padded as in
    probe_case."""
    return fitted(replace(case, batch=5, q_len=4, kv_len=4, seed=case.seed + 1,
                          kept=(3, 2, 3, 2, 3), mask_seed=47))


def mask_behaviour(instance: Instance, case: Case, call: str,
                   convention: MaskConvention) -> str | None:
    """None when ``convention`` has the properties of a padding mask (a mask keeping every key
    changes nothing, masked keys are invisible, kept keys visible), else why not."""
    if convention.layout is MaskLayout.SHARED:
        case = replace(case, kept=(case.kept[0],) * case.batch, shared_mask=True)
    if right_padded(convention):  # lengths say right padding alone: the first keys kept
        case = replace(case, mask_seed=None)
    inputs = replace(case.inputs(call), mask_convention=convention)
    keep = inputs.keep
    rows = keep if inputs.is_self else torch.ones(keep.shape[0], inputs.query.shape[1],
                                                  dtype=torch.bool, device=keep.device)
    try:
        before = instance.forward(inputs)
        if tuple(before.shape[:2]) != tuple(inputs.query.shape[:2]):
            return f"output has shape {tuple(before.shape)}"
        unmasked = instance.forward(replace(inputs, keep=None))
        all_kept = instance.forward(replace(inputs, keep=torch.ones_like(keep)))
        masked = instance.forward(case.replace_positions(inputs, ~keep, stream=5, scale=5.0))
        kept = instance.forward(case.replace_positions(inputs, keep, stream=5, scale=5.0))
    except (ImplementationError, CapabilityError) as error:
        return f"raises ({clipped(str(error).removeprefix('forward raised '), 80)})"
    # Another kernel may run with a mask than without one: the reordering tolerance.
    if float(abs_error(all_kept, unmasked, nan_equal=True).max()) > reordering_tolerance(
            before.dtype, unmasked):
        return ALL_KEEP
    tolerance = unchanged_tolerance(before.dtype, before)
    # Rows outside ``rows`` are set to 0, not multiplied by it: a NaN there must not hide a leak.
    if float(only_rows(abs_error(masked, before, nan_equal=True), rows).max()) > tolerance:
        return LEAK
    if float(only_rows(abs_error(kept, before, nan_equal=True), rows).max()) <= tolerance:
        return "kept keys don't change the output"
    return None


@dataclass
class MaskSearch:
    """What the search found: the ``convention`` (None when none works), every convention
    tried before it with its outcome, and a ``problem`` to report (inverted mask, none works)."""

    convention: MaskConvention | None
    tried: list[tuple[MaskConvention, str]] = field(default_factory=list)
    problem: str | None = None
    doubt: str | None = None
    """The convention works, but its polarity is the opposite of what the name usually means."""
    assumed: str | None = None
    """No convention works; this one, whose only failure is a leak (or an all-keep mask that
    changes the output), is assumed: padding (or causal) then fails with the counterexample."""

    def passed_over(self) -> str | None:
        """What the forms tried before the accepted one did, in words: those that ran with
        another meaning (the first few, each with what differed), and the shapes it refuses
        (every form of them raised); None where it was the first tried."""
        if self.convention is None or not self.tried:
            return None
        ran = [(c, outcome) for c, outcome in self.tried if not outcome.startswith("raises")]
        by_outcome: dict[str, list[str]] = {}  # each outcome said once, with its forms
        for c, outcome in ran[:SHOWN_FORMS]:
            by_outcome.setdefault(outcome, []).append(c.describe())
        parts = [f"{forms[0]} runs, but {outcome}" if len(forms) == 1 else
                 f"{', '.join(forms[:-1])} and {forms[-1]} run, but {outcome}"
                 for outcome, forms in by_outcome.items()]
        if len(ran) > SHOWN_FORMS:
            parts.append(f"{len(ran) - SHOWN_FORMS} more run with another meaning")
        ran_in = {c.layout for c, _ in ran}
        # A shape the accepted form has is no shape refused in every form.
        refused = [LAYOUT_SHAPES[layout] for layout in dict.fromkeys(
            c.layout for c, outcome in self.tried if outcome.startswith("raises"))
            if layout not in ran_in and LAYOUT_SHAPES[layout]
            != LAYOUT_SHAPES[self.convention.layout]]
        if refused:
            parts.append(f"shape {refused[0]} raises in every form tried" if len(refused) == 1
                         else f"shapes {', '.join(refused)} raise in every form tried")
        return "forms tried before it: " + "; ".join(parts) if parts else None

    @property
    def polarity_probed(self) -> bool:
        """The name admits both boolean polarities, and behaviour chose this one."""
        return self.convention is not None and self.convention.kind in BOOLEAN_POLARITY


def _summary(tried: list[tuple[MaskConvention, str]]) -> str:
    """What happened to the conventions tried, grouped by outcome, in a line."""
    kinds = sorted({c.kind.value for c, _ in tried})
    layouts = [LAYOUT_SHAPES[layout] for layout in dict.fromkeys(c.layout for c, _ in tried)]
    outcomes: dict[str, int] = {}
    for _, outcome in tried:
        key = "raised" if outcome.startswith("raises") else outcome
        outcomes[key] = outcomes.get(key, 0) + 1
    counted = "; ".join(f"{outcome}: {count}" for outcome, count in outcomes.items())
    return (f"tried {len(tried)} conventions (kinds {', '.join(kinds)}; shapes "
            f"{', '.join(layouts)}): {counted}")


def infer_mask(instance: Instance, case: Case, call: str, family: str, argument: str, *,
               name_settles: bool = True,
               layouts: tuple[MaskLayout, ...] | None = None) -> MaskSearch:
    """Search the conventions ``family`` admits on ``instance`` (called through the keyword
    ``mask`` of the suite's wrapper, which passes it as ``argument``); a working complement is
    accepted with a doubt, worded by whether the name settles the polarity (``name_settles``).
    ``layouts`` narrows the layouts tried."""
    search = MaskSearch(None)
    tried_layouts = [layout for layout in LAYOUTS[family] if layouts is None or layout in layouts]
    leaking: list[tuple[MaskConvention, str]] = []
    dropping: MaskConvention | None = None
    for layout in tried_layouts:
        for kind in KINDS[family]:
            whole = (False, True) if case.causal and layout in QUERY_AXIS_LAYOUTS else (False,)
            for carries in whole:
                convention = MaskConvention(kind, layout, "mask", carries_causality=carries)
                outcome = mask_behaviour(instance, case, call, convention)
                if outcome is None:
                    outcome = mask_behaviour(instance, confirming_case(case), call, convention)
                    if outcome is not None:
                        outcome = f"works at one shape only; at another: {outcome}"
                elif outcome in (LEAK, ALL_KEEP) and mask_behaviour(
                        instance, confirming_case(case), call, convention) == outcome:
                    leaking.append((convention, outcome))
                    if outcome == ALL_KEEP and layout is L.KEY_PADDING and case.causal:
                        dropping = dropping or convention
                if outcome is None and dropping is not None:
                    return _drops_causality(search, dropping, convention, argument)
                if outcome is None:
                    search.convention = convention
                    return search
                search.tried.append((convention, outcome))
    for kind in COMPLEMENT.get(family, ()):
        for layout in tried_layouts:
            convention = MaskConvention(kind, layout, "mask")
            if (mask_behaviour(instance, case, call, convention) is None and
                    mask_behaviour(instance, confirming_case(case), call, convention) is None):
                # Behaviour is that of a mask, with the polarity the name does not suggest:
                # intent, which only a declaration settles (a warning, never a failure).
                search.convention = convention
                search.doubt = _polarity_doubt(argument, family, convention, name_settles)
                return search
    if leaking:
        # Leaks first: a leak is the mask's own property broken.
        convention, outcome = min(leaking, key=lambda item: item[1] != LEAK)
        search.convention = convention
        if outcome == LEAK:
            search.assumed = (
                f"{argument}: no convention makes masked keys invisible; read as "
                f"{convention.describe()}, the first that runs on every shape tried and leaves "
                f"an all-keep mask harmless: masked keys leak ({_summary(search.tried)})")
        else:
            # Only a causal module's mask can replace its causal masking: said where it is one.
            why = ("does the mask replace the causal masking? see causal" if case.causal
                   else "see padding")
            search.assumed = (
                f"{argument}: no convention keeps an all-keep mask harmless; read as "
                f"{convention.describe()}, the first that hides masked keys on every shape "
                f"tried: given a mask, the output changes in another way ({why}) "
                f"({_summary(search.tried)})")
        return search
    search.problem = (f"{argument}: no mask convention makes masked keys invisible "
                      f"({_summary(search.tried)})")
    return search


USUAL_POLARITY = {"keep": "1/True = attend", "ignore": "True = masked"}
"""What a name of each family usually means, in words."""

PRECEDENTS = {"keep": "OpenNMT reads its `mask` so",
              "ignore": "torchtune's generation utilities read a `padding_mask` so"}
"""Code in real use that reads a mask of each family the other way."""


def _polarity_doubt(argument: str, family: str, convention: MaskConvention,
                    name_settles: bool) -> str:
    """The warning for a mask read with the polarity opposite to its name's usual one: the
    evidence, the precedent, and the two readings (intended, or inverted); declaring the
    polarity settles it (the remedy beside it, see ``features.mask_form``)."""
    usual = "strongly" if name_settles else "usually"
    return (f"{argument}: behaves as a mask read as {convention.describe()}, the opposite of "
            f"what a mask named {argument!r} {usual} means ({USUAL_POLARITY[family]}); with "
            f"that polarity masked keys are invisible and kept keys visible (probed on two "
            f"shapes): intended ({PRECEDENTS[family]}), or the mask is inverted")


def _drops_causality(search: MaskSearch, padding: MaskConvention, whole: MaskConvention,
                     argument: str) -> MaskSearch:
    """A causal module that takes a (B, Lk) padding mask, which can carry no causality, and
    is no longer causal with it: the padding mask is assumed, so that ``causal`` shows the
    future leaking through it, even though a whole-mask convention works."""
    search.convention = padding
    search.assumed = (
        f"{argument}: a (B, Lk) padding mask ({padding.describe()}) runs and hides the masked "
        f"keys, but with it the module is no longer causal (a mask keeping every key changes the "
        f"output), although a padding mask can carry no causality; only as the whole mask, "
        f"causality included ({whole.describe()}), does it behave: checked with the padding mask "
        "(see causal)")
    return search


def _moved_apart(instance: Instance, case: Case, call: str, *, later: bool) -> bool:
    """Whether, the inputs after position 2 (``later``) or up to it replaced, the rows on the
    other side of position 2 stay as they were while those on the replaced side move."""
    inputs = case.inputs(call, use_mask=False)
    replaced = torch.zeros(case.batch, case.kv_len, dtype=torch.bool)
    replaced[:, 3:] = later
    replaced[:, :3] = not later
    before = instance.forward(inputs)
    change = abs_error(instance.forward(case.replace_positions(inputs, replaced, stream=5,
                                                               scale=5.0, query_too=True)),
                       before)
    tolerance = unchanged_tolerance(before.dtype, before)
    kept, moved = (change[:, :3], change[:, 3:]) if later else (change[:, 3:], change[:, :3])
    return float(kept.max()) <= tolerance and float(moved.max()) > tolerance


def is_causal(instance: Instance, case: Case, call: str) -> bool:
    """Whether rows 0..2 ignore every input after position 2 (while later rows do change)."""
    return _moved_apart(instance, case, call, later=True)


def sees_only_later(instance: Instance, case: Case, call: str) -> bool:
    """Whether rows 3.. ignore every input before position 3 (while rows 0..2 do change): each
    row sees itself and the later positions alone, a causal mask transposed."""
    return _moved_apart(instance, case, call, later=False)


def causal_by_structure(instance: Instance, case: Case, call: str) -> bool:
    """Whether every attention weight on a later key is exactly 0 inside its forward (observed
    at its core): a layer whose output then still moves with later inputs leaks around them."""
    try:
        return instance.observe(case.inputs(call, use_mask=False)).causal_weights()
    except (ImplementationError, CapabilityError):
        return False


def batch_independent(instance: Instance, case: Case, call: str) -> bool:
    """Whether changing batch element 1 leaves element 0's output unchanged."""
    inputs = case.inputs(call, use_mask=False)
    other = torch.zeros(case.batch, case.q_len, dtype=torch.bool)
    other[1] = True
    before = instance.forward(inputs)
    after = instance.forward(case.replace_positions(inputs, other, stream=7, scale=3.0,
                                                    query_too=True))
    return float(abs_error(after, before)[0].max()) <= unchanged_tolerance(before.dtype, before)


def sequence_first(build: Callable[[bool], Instance], case: Case, call: str) -> bool:
    """Whether the module reads (length, batch, width): mixing batch elements when called
    batch-first, and independent when its inputs are transposed."""
    try:
        if batch_independent(build(False), case, call):
            return False
        return batch_independent(build(True), case, call)
    except ImplementationError:
        return False
