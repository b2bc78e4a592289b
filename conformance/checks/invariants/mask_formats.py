"""Mask formats: every mask format an implementation accepts means the same thing.

Property: for every declared alternative mask format (bool or additive, (B, Lk), (B, 1, 1, Lk),
(B, Lq, Lk), (B, H, Lq, Lk)), the output equals the output with the primary format (within the
reordering tolerance). A format whose output instead equals the primary one's under the
complementary mask is reported as inverted.
"""

from __future__ import annotations

from dataclasses import replace

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import fmt, mask_skip_reason
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import abs_error, only_rows, reordering_tolerance, worst_index
from conformance.subject.boundary import ImplementationError


class MaskFormats(Check):
    """Every declared mask format gives the primary format's output."""

    name = "mask_formats"
    order = 90
    applies = "more than one mask format"
    title = "every accepted mask format (bool/additive, each shape) gives the same output"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.mask is None:
            return mask_skip_reason(capabilities)
        if not capabilities.mask_formats:
            return Lacking("one mask format")
        return None

    def run(self, context: CheckContext) -> None:
        context.explore(cases(context.capabilities, context.device, masks="partly_masked"),
                        lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        caps = context.capabilities
        instance, inputs, primary, rows = context.first_call(case)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), primary)
        for convention in caps.mask_formats:
            try:
                other = context.run(instance, replace(inputs, mask_convention=convention), case)
            except ImplementationError as error:
                raise Violation(f"mask format {convention.describe()}: {error}") from error
            diff = only_rows(abs_error(other, primary, nan_equal=True), rows)
            if float(diff.max()) <= tolerance:
                continue
            b, row, _ = worst_index(diff)

            def inverted(convention=convention, other=other) -> str | None:
                """The format read inverted, where it gives the primary format's output
                under the complement mask."""
                complement = ~inputs.keep
                both = rows & complement.cpu().any(-1, keepdim=True)
                flipped = context.run(instance, inputs.with_mask(complement), case)
                if bool(both.any()) and float(only_rows(abs_error(other, flipped,
                                                                  nan_equal=True),
                                                        both).max()) <= tolerance:
                    return (f"the format {convention.describe()} reads its mask inverted "
                            "(True/1 taken as 'ignore', or -inf where 0 belongs)")
                return None

            hint = context.hint(inverted)
            raise Violation(
                f"mask format {convention.describe()} gives another output than "
                f"{caps.mask.describe()}: row {row} of batch {b} differs by "
                f"{fmt(float(diff[b, row].max()))} (allowed {fmt(tolerance)})", hint=hint)
