"""Path agreement: every way of calling the implementation computes the same attention.

Property: on rows with a key to attend to, the output is the same (within the reordering
tolerance) whether forward runs under ``torch.no_grad()`` or with autograd on (fused inference
kernels often hide behind the first), in train mode at p = 0 and in eval mode (where the dropout
rate is configurable), and with every other path to the same attention (``need_weights=True``,
``output_attentions=True``: declared, or found in forward's switches), causal calls included
where causality is an argument (a weights-returning path that drops the causal mask).
A forward-only kernel (probed: no gradient, or none taken) has no autograd path to compare.
"""

from __future__ import annotations

from dataclasses import replace

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.numerics.tolerance import abs_error, only_rows, reordering_tolerance, worst_index


class PathAgreement(Check):
    """No-grad and autograd, train at p = 0 and eval, and declared paths all agree."""

    name = "path_agreement"
    order = 170
    applies = "every implementation"
    title = "no_grad vs autograd, train at p = 0 vs eval, declared paths: same output"

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        context.explore(cases(caps, context.device,
                              masks="auto"),
                        lambda case: self.verify(context, case))
        if caps.causality.kind == "optional" and caps.paths:  # each path, asked to be causal
            context.explore(cases(caps, context.device, causal=True, min_len=2, masks="auto"),
                            lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        caps = context.capabilities
        instance, inputs, output, rows = context.first_call(case)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), output)
        # A forward-only kernel has no autograd path to agree (FlexAttention on a CPU raises
        # for inputs that require gradients): its refusal, not a disagreement.
        paths = [] if caps.forward_only else [
            ("autograd enabled", lambda: instance.forward(inputs, autograd=True))]
        if caps.dropout == "config":
            paths.append(("train mode at p = 0",
                          lambda: instance.forward(inputs, training=True, seed=0)))
        for name, options in caps.paths:
            paths.append((name, lambda options=options: instance.forward(
                replace(inputs, options=options))))
        for name, compute in paths:
            computed = compute()
            diff = only_rows(abs_error(computed, output, nan_equal=True), rows)
            if float(diff.max()) > tolerance:
                b, row, _ = worst_index(diff)
                raise Violation(
                    f"path '{name}' differs from the no-grad eval call (row {row} of batch {b}, "
                    f"by {fmt(float(diff[b, row].max()))}, allowed {fmt(tolerance)})",
                    hint=context.hint(lambda computed=computed, name=name: _uncausal(
                        instance, inputs, computed, tolerance, name) if case.causal else None))


def _uncausal(instance, inputs, computed, tolerance: float, name: str) -> str | None:
    """Where the path asked to be causal computes what the default call does when not asked
    (every row sees the future): that it drops the causal mask, in words; else None."""
    unmasked = instance.forward(replace(inputs, causal=False))
    if float(abs_error(computed, unmasked, nan_equal=True).max()) > tolerance:
        return None
    return (f"the path '{name}' computes the attention without its causal mask (its output is "
            "the default call's when not asked to be causal): does the path that returns the "
            "weights skip the causal masking?")
