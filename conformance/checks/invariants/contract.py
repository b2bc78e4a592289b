"""Contract: the implementation keeps the promises of its declared convention.

Property: every declared feature works (the mask, kv_len != q_len, optional causality, weight
access, float64); for every generated case forward returns a tensor of shape (B, Lq, d_model) in
the input's dtype and on its device, finite in every row with a key to attend to (in cases
without a padding mask: with one, a NaN row is the mask checks' to judge); it leaves its inputs
unmodified, gives the same output for non-contiguous inputs (a transposed memory layout, a slice
of a wider tensor) as for contiguous ones, and works at length 1. Printing to stdout in forward
is a warning (it breaks no promise of attention, but slows every call and floods logs). A layer
whose model hands it contiguous states only (observed: ``contiguous_only``) is not given other
layouts: they are outside its domain, which the result says.
"""

from __future__ import annotations

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.gate import LOW_PRECISION
from conformance.checks.invariants.likely_bug import expect_finite_or_mask_mistake
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import CheckFailed, Violation
from conformance.generation.base_case import base_case
from conformance.generation.cases import Case, dtype_name
from conformance.generation.strategies import cases
from conformance.numerics.tolerance import abs_error, only_rows, reordering_tolerance, worst_index
from conformance.subject.boundary import ImplementationError, Inputs

LOW_PRECISION_NAMES = {dtype_name(d) for d in LOW_PRECISION}

OUTSIDE_ITS_DOMAIN = ("non-contiguous inputs not tried: its model hands it contiguous hidden "
                      "states only (observed on the model's own forward), so other layouts are "
                      "outside its domain")


def _transposed_layout(tensor: torch.Tensor) -> torch.Tensor:
    """Same values, (B, D, L)-major memory: non-contiguous."""
    return tensor.transpose(1, 2).contiguous().transpose(1, 2)


def _slice_of_wider(tensor: torch.Tensor) -> torch.Tensor:
    """Same values, the first half of a tensor twice as wide: non-contiguous rows."""
    return torch.cat([tensor, torch.zeros_like(tensor)], dim=-1)[..., : tensor.shape[-1]]


def _restrided(inputs: Inputs, layout) -> Inputs:
    if inputs.is_self:
        return Inputs.self_attention(layout(inputs.query), inputs.keep, inputs.causal)
    return Inputs(layout(inputs.query), layout(inputs.key), layout(inputs.value), inputs.keep,
                  inputs.causal)


class Contract(Check):
    """Declared features work; shapes, dtypes, devices right; inputs untouched; layouts irrelevant;
    length 1 works; printing warned about."""

    name = "contract"
    order = 10
    applies = "every implementation"
    title = "declared features work; inputs untouched; any memory layout; length 1; no prints"
    owns = ("mask", "cross_attention", "causal", "weights", "float32", "float64")

    def run(self, context: CheckContext) -> None:
        problems = [p for feature, p in context.broken.items() if feature not in LOW_PRECISION_NAMES]
        if problems:
            raise CheckFailed(Violation(problems[0], details=problems[1:]), None)
        caps = context.capabilities
        if caps.doubts.length is not None:  # measured by inference, at two configurations
            raise CheckFailed(Violation(caps.doubts.length), None)
        first = caps.floats.supported[0]
        # One token (or the fewest it runs at on this device: base_case keeps to min_len).
        single = [base_case(caps, first, context.device, q_len=1, kv_len=1)]
        if caps.cross_attention:
            single += [base_case(caps, first, context.device, q_len=single[0].q_len, kv_len=3),
                       base_case(caps, first, context.device, q_len=3, kv_len=1)]
        if caps.contiguous_only:
            context.observe(OUTSIDE_ITS_DOMAIN)
        context.explore(cases(caps, context.device,
                              masks="auto"),
                        lambda case: self.verify(context, case), examples=single)

    def verify(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        output = context.run(instance, inputs, case)
        if instance.input_writes:
            raise Violation(
                f"forward modified its input(s) {', '.join(instance.input_writes)} in place",
                hint="an in-place op (mul_, masked_fill_, +=) on an argument: use the "
                     "out-of-place form")

        rows = context.rows(case)  # fully masked rows are the fully_masked check's
        if case.kept is None:  # with a padding mask, a NaN row is the mask checks' to judge
            expect_finite_or_mask_mistake(context, case, output, rows)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), output)
        layouts = (() if context.capabilities.contiguous_only else
                   (("transposed memory layout", _transposed_layout),
                    ("slice of a wider tensor", _slice_of_wider)))
        for label, layout in layouts:
            try:
                other = context.run(instance, _restrided(inputs, layout), case)
            except ImplementationError as error:
                raise Violation(
                    f"non-contiguous inputs ({label}): {error}",
                    hint="view() on an input (or on a tensor derived from it) needs contiguous "
                         "memory: use reshape()") from error
            diff = only_rows(abs_error(other, output, nan_equal=True), rows)
            if float(diff.max()) > tolerance:
                _same_twice(context, instance, inputs, case, output, rows, tolerance)
                b, row, feature = worst_index(diff)
                raise Violation(
                    f"non-contiguous inputs ({label}) change output row {row} of batch {b} by "
                    f"{fmt(float(diff[b, row, feature]))} (allowed {fmt(tolerance)})",
                    hint="does forward reinterpret memory (view/as_strided) instead of reshaping?")

        printed = instance.stdout
        if printed:
            # Printing breaks no promise of attention: a warning. What was printed is not
            # quoted: in grading, the reason reaches the student, and printed output is the
            # teacher's only (a submission could print what it read on the grading machine).
            raise Violation(
                f"forward printed {len(printed)} characters to stdout",
                hint="debugging prints left in forward: they slow every call and flood logs",
                severity="warn")


def _same_twice(context: CheckContext, instance, inputs: Inputs, case: Case,
                output: torch.Tensor, rows: torch.Tensor, tolerance: float) -> None:
    """Raise Violation where the very inputs, called again, give another output: then what
    changed the output is not the memory layout (and no layout hint fits)."""
    again = context.run(instance, inputs, case)
    diff = only_rows(abs_error(again, output, nan_equal=True), rows)
    if float(diff.max()) > tolerance:
        b, row, feature = worst_index(diff)
        raise Violation(
            f"the same inputs called twice give outputs differing at row {row} of batch {b} by "
            f"{fmt(float(diff[b, row, feature]))} (allowed {fmt(tolerance)}): the output is not "
            "a function of the inputs in eval mode",
            hint="randomness in eval mode (noise, dropout not switched off by eval()), or state "
                 "kept between calls (a counter, a cache)?")
