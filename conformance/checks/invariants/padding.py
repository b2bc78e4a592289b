"""Padding: masked keys are invisible.

Property: under a key-padding mask that keeps at least one key in every batch element, replacing
the key/value inputs at masked positions leaves every output row with a key to attend to unchanged
(for self-attention, every such row whose own position is kept), and every such row gives every
masked key attention weight 0. Rows where every key is masked are the ``fully_masked`` check's.
What self-attention outputs at a padded query position is unspecified unless declared: ``zero``
(the row is what zero attention weights give: the output projection's bias, or 0), ``self`` (the
padded query attends to itself alone: its own value, projected) or ``any`` (it attends to the
kept keys like any row, judged by every check); a declared policy is checked against the float64
reference.

A module whose mask argument inference could give no convention (none makes masked keys
invisible) fails here, once, with what was tried; the other mask checks skip.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.likely_bug import expect_finite_or_mask_mistake
from conformance.checks.invariants.verify import fmt, reference_applies
from conformance.checks.invariants.violation import CheckFailed, Lacking, Violation
from conformance.checks.mask_mistakes import Mistake, named, weights_mistake
from conformance.generation.base_case import base_case
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.inference.observing.attention_probe import measure_attention
from conformance.model.remedies import Option, Remedy
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import (
    abs_error,
    eps,
    only_rows,
    reordering_tolerance,
    unchanged_tolerance,
    worst_index,
)
from conformance.subject.boundary import ImplementationError, Inputs, Instance

NOISE_SCALE = 10.0
"""Replacement inputs at masked positions are this much larger than the originals, so any leak
shows up far above rounding."""


UNRESOLVED_HINT = ("if it is meant to read its mask as tried, the mask is not applied as it "
                   "should be; if it reads it another way, that can be declared")
UNRESOLVED_REMEDY = Remedy((Option("mask", "KIND:LAYOUT@ARGUMENT",
                                   "the way it reads its mask, e.g. keep_bool:per_query@attn_mask"),))
ASSUMED_REMEDY = Remedy.to("mask", None, "state the mask it takes, if the one assumed is not it")


def revealing_masks(caps: Capabilities, device: str) -> tuple[Case, ...]:
    """The case always tried first for an always-causal layer: in every batch element a masked
    key before a kept one, key 0 kept (inference's probe case). Under causal masking, right
    padding hides masked keys from every kept row whatever the mask does, so a mask applied on
    the query axis, or not at all below the diagonal, shows only here."""
    if (caps.causality.kind != "always" or caps.cross_attention or caps.queries is not None
            or caps.length_near(6) < 6):
        return ()  # without causal masking, the generated masks show it
    dtype = torch.float32 if torch.float32 in caps.floats.supported else caps.floats.supported[0]
    length = caps.length_near(6)
    case = base_case(caps, dtype, device, q_len=length, kv_len=length, kept=(3, 4), mask_seed=2)
    return () if (case.shared_mask or case.mask_seed is None
                  or not bool(case.attendable_rows().all())) else (case,)


def _positions(row: torch.Tensor) -> list[int]:
    return [int(i) for i in torch.nonzero(row).flatten()]


class Padding(Check):
    """Masked keys have no influence, and their attention weight is 0."""

    name = "padding"
    order = 20
    applies = "a padding mask (declared or inferred)"
    title = "masked keys have no influence and attention weight 0"
    judges = ("mask",)

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.mask is None and not capabilities.doubts.mask_problem:
            return Lacking("no padding mask")
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        if caps.mask is None:
            raise CheckFailed(Violation(caps.doubts.mask_problem, hint=UNRESOLVED_HINT,
                                        remedy=UNRESOLVED_REMEDY), None)
        try:
            context.explore(cases(caps, context.device, masks="partly_masked"),
                            lambda case: self.no_influence(context, case),
                            examples=revealing_masks(caps, context.device))
        except CheckFailed as failure:
            if caps.doubts.mask_assumed and isinstance(failure.error, Violation):
                failure.error.details.append(f"the mask convention was assumed: "
                                             f"{caps.doubts.mask_assumed}")
                failure.error.remedy = failure.error.remedy or ASSUMED_REMEDY
            raise
        if caps.weights:
            context.explore(cases(caps, context.device, masks="partly_masked", probe=True),
                            lambda case: self.zero_weight(context, case))
        if caps.padded_queries in ("zero", "self") and caps.call == "self":
            if caps.weights:
                context.explore(cases(caps, context.device, masks="partly_masked"),
                                lambda case: self.padded_queries(context, case))
            else:
                context.observe(f"padded queries declared {caps.padded_queries!r}: not checked "
                                "(it needs weight access)")
        polarity = caps.doubts.mask_polarity
        if polarity is not None:
            context.doubt(polarity.text, "inference can't know which polarity was meant: it "
                          "checked the module with the one it reads", polarity.remedy)

    def no_influence(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        keep = inputs.keep
        rows = context.rows(case)
        if inputs.is_self:
            rows = rows & keep.cpu()  # a masked position's own query changes too
        before = context.run(instance, inputs, case)
        expect_finite_or_mask_mistake(context, case, before, rows)
        changed = case.replace_positions(inputs, ~keep, stream=11, scale=NOISE_SCALE)
        after = context.run(instance, changed, case)
        diff = only_rows(abs_error(after, before), rows)
        tolerance = unchanged_tolerance(context.judged(before.dtype), before)
        if float(diff.max()) <= tolerance:
            return
        b, row, feature = worst_index(diff)
        hint = context.hint(lambda: self._mistake(context, case, instance, inputs, before, rows))
        raise Violation(
            f"changing key/value inputs at masked positions changed output row {row} of batch "
            f"{b} by {fmt(float(diff[b, row, feature]))} (tolerance {fmt(tolerance)})",
            details=[f"batch {b} keeps keys {_positions(keep[b])}, masks "
                     f"{_positions(~keep[b])}; largest change at feature {feature}"],
            hint=hint)

    @staticmethod
    def _mistake(context: CheckContext, case: Case, instance: Instance, inputs: Inputs,
                 output: torch.Tensor, rows: torch.Tensor) -> str | None:
        """The mask mistake the module's behaviour reproduces, in words, or None: with weight
        access, its output matches the float64 reference with the mask inverted, or with the
        masked weights zeroed after the softmax; without, in cross-attention, the output does
        not depend on the kept keys at all (it depends on the masked ones: that is the
        failure)."""
        caps = context.capabilities
        if reference_applies(caps):
            return named(context.mask_mistake(case, only=(Mistake.INVERTED,
                                                          Mistake.AFTER_SOFTMAX)))
        if inputs.is_self or caps.position.positional:
            return None  # x is queries and keys at once: kept keys can't be changed alone
        try:
            kept_changed = context.run(instance, case.replace_positions(
                inputs, inputs.keep, stream=11, scale=NOISE_SCALE), case)
        except (Violation, ImplementationError):
            return None
        tolerance = unchanged_tolerance(context.judged(output.dtype), output)
        if float(only_rows(abs_error(kept_changed, output), rows).max()) <= tolerance:
            return (f"{Mistake.INVERTED.words} (the output does not depend on the kept keys "
                    "at all)")
        return None

    def padded_queries(self, context: CheckContext, case: Case) -> None:
        """Rows at padded query positions follow the declared policy (``zero``, ``self``)."""
        instance, inputs, output, _ = context.first_call(case)
        weights = instance.read_weights().expanded().map(lambda t: t.to(torch.float64).cpu())
        x = inputs.query.to(torch.float64).cpu()
        if context.capabilities.padded_queries == "zero":
            heads = torch.zeros(*x.shape[:2], weights.num_heads * weights.value_dim,
                                dtype=torch.float64)
            words = "what zero attention weights give"
        else:
            heads = (torch.einsum("bld,hed->blhe", x, weights.w_v) + weights.b_v).flatten(2)
            words = "its own value (attending to itself alone)"
        expected = heads if weights.w_o is None else heads @ weights.w_o.T + weights.b_o
        padded = ~case.keep().cpu() & case.attendable_rows()
        diff = only_rows(abs_error(output, expected), padded)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), expected)
        if float(diff.max()) <= tolerance:
            return
        b, row, feature = worst_index(diff)
        raise Violation(
            f"padded query {row} of batch {b} gives {fmt(float(output[b, row, feature]))} at "
            f"feature {feature}, not {fmt(float(expected[b, row, feature]))}: {words}, as "
            f"declared (padded queries {context.capabilities.padded_queries!r})",
            details=[f"batch {b} keeps {_positions(case.keep()[b])}"])

    @staticmethod
    def _overflow(context: CheckContext, case: Case, instance: Instance) -> str:
        """Why a row's weights are all non-finite: a half-precision overflow where the same
        case in float32 measures finite, leak-free weights; else the symptom alone."""
        symptom = "the kept keys' weights are not finite either: the whole row is lost"
        wide = replace(case, dtype="float32")
        if case.dtype not in ("float16", "bfloat16") or torch.float32 not in (
                context.capabilities.floats.supported):
            return symptom
        try:
            attention = measure_attention(context.build(wide), wide, context.capabilities.call,
                                          keep=wide.keep())
        except (Violation, ImplementationError, ValueError):
            return symptom
        rows = context.rows(wide)[:, None, :, None].expand_as(attention)
        masked = (~wide.keep()).cpu()[:, None, None, :].expand_as(attention) & rows
        if not bool(torch.isfinite(attention[rows]).all()) or bool(
                (attention[masked].abs() > eps(torch.float32)).any()):
            return symptom
        return (f"the kept keys' weights are not finite either: the softmax of this row "
                f"overflows in {case.dtype}, and the same case in float32 is finite and leaks "
                "nothing (exp taken without subtracting the row's maximum first? A softmax that "
                "subtracts it can't overflow)")

    def zero_weight(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        keep = case.keep()
        attention = measure_attention(instance, case, context.capabilities.call, keep=keep)
        masked = (~keep).cpu()[:, None, None, :] & context.rows(case)[:, None, :, None]
        leaked = torch.where(masked, torch.nan_to_num(attention.abs(), nan=float("inf")), 0.0)
        if float(leaked.max()) <= eps(context.judged(case.config.dtype)):
            return
        b, h, row, key = worst_index(leaked)
        weights = attention[b, h, row]
        if not bool(weights[keep[b].cpu()].isfinite().any()):
            # Not a leak: the kept keys' weights are lost too.
            hint = context.hint(lambda: self._overflow(context, case, instance))
        else:
            hint = context.hint(lambda: named(weights_mistake(
                attention, keep, causal=False, tolerance=eps(context.judged(case.config.dtype)),
                rows=context.rows(case), only=(Mistake.INVERTED,))))
        raise Violation(
            f"batch {b}, head {h}, row {row} gives masked key {key} attention weight "
            f"{fmt(float(attention[b, h, row, key]))}, not 0",
            details=[f"batch {b} keeps keys {_positions(keep[b])}",
                     "weights of that row: " + ", ".join(fmt(float(w)) for w in weights)],
            hint=hint)
