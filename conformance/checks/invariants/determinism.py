"""Determinism: on the CPU, the same call twice gives the same output, bit for bit.

Property: calling forward twice in eval mode with the same inputs (and a freshly built copy from
the same seed once more) gives bit-identical outputs. Where the dropout rate is configurable it
is set above zero, as users build the module: eval mode must still be deterministic.
"""

from __future__ import annotations

from dataclasses import replace

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.dropout import CONFIGURED_RATE
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.numerics.tolerance import abs_error, worst_index


class Determinism(Check):
    """The same call twice gives bit-identical output on the CPU."""

    name = "determinism"
    order = 160
    applies = "every implementation, on the CPU"
    title = "the same call twice gives bit-identical output (CPU)"

    def device_skip_reason(self, device: str) -> str | None:
        if device != "cpu":
            return "checked on the CPU, where bit-identical repeats are promised"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        rate = CONFIGURED_RATE if caps.dropout == "config" else 0.0
        context.explore(cases(caps, context.device,
                              masks="auto").map(
                            lambda case: replace(case, dropout=rate)),
                        lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        inputs = case.inputs(context.capabilities.call)
        instance = context.build(case)
        first = context.run(instance, inputs, case)
        for label, again in (("the same call again", context.run(instance, inputs, case)),
                             ("a copy built from the same seed",
                              context.run(context.build(case), inputs, case))):
            diff = abs_error(again, first, nan_equal=True)
            if float(diff.max()) > 0.0:
                b, row, _ = worst_index(diff)
                raise Violation(
                    f"{label} differs from the first call (row {row} of batch {b}, by "
                    f"{fmt(float(diff[b, row].max()))})",
                    hint="is dropout (or other randomness) active in eval mode?")
