"""Low precision: float16 and bfloat16 work where declared, and agree with the reference.

Property: where float16 / bfloat16 is declared, forward runs in it (with and without the mask)
and returns that dtype, its rows with keys are finite, and (with weight access) it agrees with
the float64 reference under the tolerance rule (the baseline is the suite's plain attention in
the same dtype). A masking value that overflows float16 (-1e9, -1e20) is reported as exactly
that, with the exception text.
"""

from __future__ import annotations

from conformance.cases import Case, dtype_name
from conformance.invariants.base import (
    Check,
    CheckContext,
    CheckFailed,
    Violation,
    agree_with_reference,
)
from conformance.invariants.gate import LOW_PRECISION
from conformance.spec import Capabilities
from conformance.strategies import cases

OVERFLOW_WORDS = ("without overflow", "cannot be converted to type at::Half",
                  "cannot be converted to type at::BFloat16")


def overflow_hint(problem: str) -> str | None:
    if any(words in problem for words in OVERFLOW_WORDS):
        return ("the masking value overflows float16 (largest finite 65504): fill with "
                "torch.finfo(scores.dtype).min or float('-inf') instead of -1e9 / -1e20")
    return None


class LowPrecision(Check):
    """float16 / bfloat16 run where declared and agree with the reference."""

    name = "low_precision"
    title = "float16 / bfloat16 run where declared and agree with the reference"
    owns = tuple(dtype_name(d) for d in LOW_PRECISION)

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if not any(d in LOW_PRECISION for d in capabilities.dtypes):
            return "declares no float16 or bfloat16"
        return None

    def run(self, context: CheckContext) -> None:
        low_names = {dtype_name(d) for d in LOW_PRECISION}
        problems = [p for feature, p in context.broken.items() if feature in low_names]
        if problems:
            raise CheckFailed(Violation(problems[0], details=problems[1:],
                                        hint=overflow_hint(problems[0])), None)
        caps = context.capabilities
        low = tuple(d for d in caps.dtypes if d in LOW_PRECISION)
        if not low:  # every declared low-precision dtype broke at the gate (reported above)
            return
        context.explore(cases(caps, context.device, dtypes=low,
                              masks="auto"),
                        lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        instance, inputs, output, rows = context.first_call(case, finite=True)
        if not context.capabilities.weights:
            return
        seen, _ = agree_with_reference(output, instance.read_weights(), inputs, case, rows,
                                       judged=context.judged(case.config.dtype))
        if not seen.ok:
            b, row, _ = seen.worst
            raise Violation(f"in {case.dtype} the output differs from the float64 reference: "
                            f"{seen.describe()} (row {row} of batch {b})",
                            hint="is a low-precision intermediate (logits, softmax sum) kept "
                                 "where the same-dtype baseline upcasts or scales first?")
