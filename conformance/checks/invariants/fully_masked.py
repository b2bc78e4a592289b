"""Fully masked rows: a row with no key to attend to behaves one declared way, and stays contained.

Property: rows whose every key is masked (by padding, and causality where it applies) all behave
the same way, and that way is the declared policy: ``zeros`` (attention weights 0, so the layer
output is the output bias, as F.scaled_dot_product_attention does since PyTorch 2.5), ``nan``, or
``uniform`` (weight 1/Lk on every key, what a finite fill such as -1e9 gives); with ``report``
the behaviour is only reported. In every policy, rows with a key to attend to are unchanged by
another element's fully masked rows and match the float64 reference (where weights are
accessible), and the input gradients of every batch element without a fully masked row stay
finite. Where the fully masked rows' output is finite (any policy but ``nan``), every gradient
is finite too: a forward that repairs the NaN (``nan_to_num`` after a softmax of -inf) while
the backward still carries it trains silently into NaN. (Under the ``nan`` policy the NaN in the
forward says so: a NaN gradient within that element is reported, not failed.)

Rows that differ only because an additive mask of the dtype's most negative value, plus the row's
own logits, rounds in half precision (HuggingFace's eager attention with its own masks) are a
warning: a softmax of rounding is beyond the normal range. A spill that happens only in a
low-precision dtype, on a platform whose matmul is known to carry a NaN row into its neighbour
(see :mod:`conformance.numerics.platform_defects`), while the same case in float32 is clean, is the
platform's: a warning naming it.
"""

from __future__ import annotations

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.likely_bug import expect_finite_or_mask_mistake
from conformance.checks.invariants.platform import platform_or
from conformance.checks.invariants.verify import (
    agree_with_reference,
    fmt,
    mask_skip_reason,
    reference_applies,
)
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.inference.observing.attention_probe import measure_attention
from conformance.model.mask_forms import MaskKind
from conformance.model.spec import Capabilities
from conformance.model.weights import user_path
from conformance.numerics.tolerance import abs_error, eps, only_rows, unchanged_tolerance, worst_index

POLICY_WORDS = {"zeros": "zeros", "nan": "NaN", "uniform": "uniform over all keys"}
OWN_KEY = "its own key alone (each row attends to the key at its own position)"
FINITE = "finite output (their weights not measured: no weight layout)"
HALF = ("float16", "bfloat16")
"""Dtypes whose most negative value plus an ordinary logit rounds to another step."""
"""What is known of a fully masked row without weight access: its output is finite."""


def classify_row(weights: torch.Tensor, dtype: torch.dtype, row: int | None = None) -> str:
    """What a fully masked row's attention weights look like; with the ``row``'s index, a row
    that attends to its own key alone (torchtune's padding masks keep the diagonal: a consistent
    fallback, whichever row) is said so."""
    if bool(torch.isnan(weights).any()):
        return "NaN"
    if float(weights.abs().max()) <= eps(dtype):
        return "zeros"
    uniform = 1.0 / weights.numel()
    if float((weights - uniform).abs().max()) <= 16 * eps(dtype):
        return "uniform over all keys"
    if row is not None and row < weights.numel():
        own = torch.zeros_like(weights)
        own[row] = 1.0
        if float((weights - own).abs().max()) <= 16 * eps(dtype):
            return OWN_KEY
    return "other (weights " + ", ".join(fmt(float(w)) for w in weights[:6]) + ")"


class FullyMasked(Check):
    """Rows with every key masked follow the declared policy and don't spill."""

    name = "fully_masked"
    order = 30
    applies = "a padding mask (declared or inferred)"
    title = "rows with every key masked follow the declared policy and stay contained"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        return mask_skip_reason(capabilities)

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        context.explore(cases(caps, context.device, masks="fully_masked", probe=caps.weights),
                        lambda case: self.verify(context, case))

    def _contained(self, context: CheckContext, case: Case) -> tuple:
        """The first call, after checking that rows with keys are finite and unchanged by other
        elements' fully masked rows: (instance, inputs, output, rows, empty elements)."""
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        empty = [b for b, count in enumerate(case.kept) if count == 0]
        rows = context.rows(case)
        output = context.run(instance, inputs, case)
        expect_finite_or_mask_mistake(context, case, output, rows)
        control_keep = inputs.keep.clone()
        control_keep[empty] = True
        control = context.run(instance, inputs.with_mask(control_keep), case)
        diff = only_rows(abs_error(output, control), rows)
        tolerance = unchanged_tolerance(context.judged(output.dtype), control)
        if float(diff.max()) > tolerance:
            b, row, _ = worst_index(diff)
            raise Violation(
                f"batch element {b} changed (row {row}, by {fmt(float(diff[b, row].max()))}) "
                f"when batch element(s) {empty} had every key masked: fully masked rows spill "
                "into other batch elements",
                hint="a reduction over the whole batch (a norm or mean without dim=) carries one "
                     "element's NaN into the others?")
        return instance, inputs, output, rows, empty

    def verify(self, context: CheckContext, case: Case) -> str:
        try:
            return self._holds(context, case)
        except Violation as violation:
            # A NaN row carried by a defective half-precision matmul, forward or backward.
            raise platform_or(context, case, violation,
                                      lambda other: self._holds(context, other)) from violation

    def _holds(self, context: CheckContext, case: Case) -> str:
        """The property on ``case``: the behaviour of its fully masked rows, in words."""
        caps = context.capabilities
        instance, inputs, output, rows, empty = self._contained(context, case)
        if reference_applies(caps):
            seen, _ = agree_with_reference(output, instance.read_weights(), inputs, case, rows,
                                           judged=context.judged(case.config.dtype),
                                           encoding=context.capabilities.position.encoding)
            if not seen.ok:
                b, row, _ = seen.worst
                raise Violation(
                    f"with batch element(s) {empty} fully masked, row {row} of batch {b} differs "
                    f"from the float64 reference: {seen.describe()}")

        notes: list[str] = []
        if not caps.forward_only:  # a forward-only kernel's output carries no gradient
            cotangent = torch.where(rows.to(output.device)[:, :, None],
                                    case.tensor(*output.shape, stream=41), 0.0)
            backward = instance.gradients(inputs, cotangent)
            gradients = backward.inputs
            whole = case.attendable_rows().all(dim=-1).tolist()
            clean = [b for b in range(case.batch) if whole[b]]
            without_keys = ~case.attendable_rows().to(output.device)
            empty_rows_finite = bool(torch.isfinite(output[without_keys]).all())
            if empty_rows_finite:
                self._finite_gradients(backward, case, empty)
            try:
                self._clean_gradients(gradients, clean, empty)
            except Violation as violation:
                raise platform_or(context, case, violation,
                                          lambda other: self._recheck_gradients(context, other)) \
                    from violation
            notes = [name for name, gradient in gradients.items()
                     if not bool(torch.isfinite(gradient).all())]

        behaviour = self._behaviour(context, case, instance)
        declared = caps.fully_masked
        # Without weights only NaN or not is measured: a finite row may be either finite policy.
        unmeasured = behaviour == FINITE and declared != "nan"
        if declared != "report" and behaviour != POLICY_WORDS[declared] and not unmeasured:
            raise Violation(f"rows with every key masked give {behaviour}; the declared policy "
                            f"is {POLICY_WORDS[declared]}")
        if notes:
            self_note = (f"gradients of the inputs of an element with a fully masked row are not "
                         f"finite ({', '.join(notes)}): such a batch poisons training")
            context.observe(self_note)
        return f"rows with every key masked give {behaviour}"

    @staticmethod
    def _clean_gradients(gradients: dict[str, torch.Tensor], clean: list[int],
                         empty: list[int]) -> None:
        """The input gradients of elements without a fully masked row are finite."""
        for name, gradient in gradients.items():
            bad = ~torch.isfinite(gradient[clean])
            if bool(bad.any()):
                i, position, _ = (int(v) for v in torch.nonzero(bad)[0])
                raise Violation(
                    f"the gradient with respect to {name} of batch element {clean[i]} "
                    f"(position {position}) is not finite when batch element(s) {empty} are fully "
                    "masked", hint="a NaN from the fully masked rows flows back through a shared "
                                   "reduction")

    def _recheck_gradients(self, context: CheckContext, case: Case) -> None:
        """The clean elements' gradients on ``case`` (for the platform attribution)."""
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        rows = context.rows(case)
        output = context.run(instance, inputs, case)
        cotangent = torch.where(rows.to(output.device)[:, :, None],
                                case.tensor(*output.shape, stream=41), 0.0)
        whole = case.attendable_rows().all(dim=-1).tolist()
        self._clean_gradients(instance.gradients(inputs, cotangent).inputs,
                              [b for b in range(case.batch) if whole[b]],
                              [b for b, count in enumerate(case.kept) if count == 0])

    @staticmethod
    def _finite_gradients(backward, case: Case, empty: list[int]) -> None:
        """Finite fully masked rows must come with finite gradients, parameters included."""
        hint = ("-inf fill, softmax, then the NaN repaired after it (nan_to_num, masked_fill): "
                "the backward still goes through the NaN softmax. Fill with a finite minimum "
                "(torch.finfo(dtype).min), or zero the logits of empty rows before the softmax")
        for name, gradient in backward.inputs.items():
            bad = ~torch.isfinite(gradient)
            if bool(bad.any()):
                b, position, _ = (int(v) for v in torch.nonzero(bad)[0])
                raise Violation(
                    f"rows with every key masked give finite output, but the gradient with "
                    f"respect to {name} (batch {b}, position {position}) is "
                    f"{fmt(float(gradient[b, position][bad[b, position]][0]))}: a batch with a "
                    f"fully masked row (element(s) {empty}) trains into NaN", hint=hint)
        for name, gradient in backward.parameters.items():
            if gradient is not None and not bool(torch.isfinite(gradient).all()):
                raise Violation(
                    f"rows with every key masked give finite output, but the gradient of "
                    f"parameter {user_path(name)} is not finite: a batch with a fully masked row (element(s) "
                    f"{empty}) trains into NaN", hint=hint)

    @staticmethod
    def _behaviour(context: CheckContext, case: Case, instance) -> str:
        """The one behaviour of every fully masked row; a Violation if they differ. (The probe
        loads its own weights into ``instance``: this is its last use.)"""
        caps = context.capabilities
        fully_masked = torch.nonzero(~case.attendable_rows()).tolist()
        if caps.weights:
            attention = measure_attention(instance, case, caps.call, keep=case.keep(),
                                          causal=case.causal)
            dtype = context.judged(case.config.dtype)
            seen = {(b, h, row): classify_row(attention[b, h, row], dtype, row)
                    for b, row in fully_masked for h in range(case.num_heads)}
            rounding = all(_uniform_on_support(attention[b, h, row], dtype)
                           for b, row in fully_masked for h in range(case.num_heads))
        else:
            rounding = False
            output = context.run(instance, case.inputs(caps.call), case)
            seen = {(b, 0, row): "NaN" if bool(torch.isnan(output[b, row]).any()) else FINITE
                    for b, row in fully_masked}
        behaviours = sorted(set(seen.values()))
        if len(behaviours) > 1:
            examples = []
            for behaviour in behaviours:
                b, h, row = next(k for k, v in seen.items() if v == behaviour)
                examples.append(f"batch {b}, head {h}, row {row}: {behaviour}")
            rounded = _rounded_fill(caps, case) or (_ROUNDED_TRIANGLE if rounding and case.causal
                                                    else None)
            raise Violation("rows with every key masked do not all behave the same way: "
                            + "; ".join(examples) + (f" ({rounded})" if rounded else ""),
                            severity="warn" if rounded else "fail")
        return behaviours[0]


_ROUNDED_TRIANGLE = (
    "each row uniform over the keys whose masked logits rounded alike: a causal fill of the "
    "dtype's most negative value with the padding mask added to it makes a row with every key "
    "masked a softmax of rounding, beyond the normal range")
"""Why a causal layer's fully masked rows may differ by rounding alone, each uniform over the
keys whose logits rounded alike (the causal triangle filled with the dtype's most negative value
and the padding mask's added to it: the later keys overflow to -inf, the row's own logits vanish
into the fill), so one row sees its own key alone, another its visible keys, another all of them
(GPT-Neo's eager attention in its model)."""


def _uniform_on_support(weights: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a row's weights are equal wherever they are not 0 (a softmax of equal logits
    over some keys, -inf elsewhere)."""
    if not bool(torch.isfinite(weights).all()):
        return False
    support = weights[weights.abs() > eps(dtype)]
    return bool(support.numel()) and float((support - 1.0 / support.numel()).abs().max()) <= (
        16 * eps(dtype))


def _rounded_fill(caps, case: Case) -> str | None:
    """Why fully masked rows may differ by rounding alone: an additive mask of the dtype's most
    negative value in half precision, where that value plus a row's own logits rounds to steps of
    32 (float16) or more, so the softmax of such a row is of rounding (HuggingFace's eager
    attention with its own masks does this); None otherwise."""
    if caps.mask is None or caps.mask.kind is not MaskKind.ADDITIVE_MIN or case.dtype not in HALF:
        return None
    return (f"an additive mask of {case.dtype}'s most negative value: that value plus a row's "
            "logits rounds, so a row with every key masked is a softmax of rounding, beyond the "
            "normal range")
