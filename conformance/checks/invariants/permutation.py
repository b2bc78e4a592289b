"""Permutation: attention without causality has no notion of position.

Property: for non-causal attention, permuting the query positions permutes the output rows the
same way, and permuting the key/value positions jointly (with the mask) leaves the output
unchanged; for self-attention, permuting the tokens (with the mask) permutes the output rows:
f(Px) = P f(x). Queries the module holds itself (learned latents) are not moved: only the keys
are. Equal within the reordering tolerance.
"""

from __future__ import annotations

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Violation
from conformance.checks.mask_mistakes import Mistake, named
from conformance.generation.cases import Case
from conformance.generation.strategies import cases, right_padding
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import abs_error, only_rows, reordering_tolerance, worst_index


def _moving(length: int, seed: int) -> torch.Tensor:
    """A permutation of range(length) that moves something (length >= 2)."""
    order = torch.randperm(length, generator=torch.Generator().manual_seed(seed))
    if torch.equal(order, torch.arange(length)):
        order = order.roll(1)
    return order


class Permutation(Check):
    """Non-causal attention is equivariant to query order and invariant to key/value order."""

    name = "permutation"
    order = 100
    applies = "attention that order does not matter to by design (not always causal, no absolute positions)"
    title = "permuting tokens permutes the output (no position dependence without causality)"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.causality.kind == "always":
            return "always causal: order matters by design"
        if capabilities.position.positional:
            return f"{capabilities.position.positional}: order matters by design"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        # Valid lengths say right padding alone, which no permutation keeps: unmasked there.
        context.explore(cases(caps, context.device, min_len=2,
                              masks="none" if right_padding(caps) else "auto"),
                        lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        instance, inputs, output, rows = context.first_call(case)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), output)

        def hint() -> str | None:
            """A causal mask applied where none is declared, where the output shows it."""
            return context.hint(lambda: named(context.mask_mistake(
                case, only=(Mistake.CAUSAL_UNDECLARED,))))

        if inputs.is_self:
            order = _moving(case.q_len, case.seed)
            keep = None if inputs.keep is None else inputs.keep[:, order]
            moved = context.run(instance, inputs.with_tensors(inputs.query[:, order]).with_mask(
                keep), case)
            diff = only_rows(abs_error(moved, output[:, order], nan_equal=True), rows[:, order])
            if float(diff.max()) > tolerance:
                b, row, _ = worst_index(diff)
                raise Violation(
                    f"permuting the tokens as {order.tolist()} does not permute the output: row "
                    f"{row} of batch {b} is off by {fmt(float(diff[b, row].max()))} (allowed "
                    f"{fmt(tolerance)})", hint=hint())
            return

        order = _moving(case.kv_len, case.seed)
        keep = None if inputs.keep is None else inputs.keep[:, order]
        moved = context.run(instance, inputs.with_tensors(
            inputs.query, inputs.key[:, order], inputs.value[:, order]).with_mask(keep), case)
        diff = only_rows(abs_error(moved, output, nan_equal=True), rows)
        if float(diff.max()) > tolerance:
            b, row, _ = worst_index(diff)
            raise Violation(
                f"permuting the key/value positions jointly as {order.tolist()} changed output "
                f"row {row} of batch {b} by {fmt(float(diff[b, row].max()))} (allowed "
                f"{fmt(tolerance)})", hint=hint())
        if case.q_len < 2 or context.capabilities.call == "latent":  # its own queries: none to move
            return
        order = _moving(case.q_len, case.seed + 1)
        moved = context.run(instance, inputs.with_tensors(
            inputs.query[:, order], inputs.key, inputs.value), case)
        diff = only_rows(abs_error(moved, output[:, order], nan_equal=True), rows[:, order])
        if float(diff.max()) > tolerance:
            b, row, _ = worst_index(diff)
            raise Violation(
                f"permuting the query positions as {order.tolist()} does not permute the output "
                f"rows: row {row} of batch {b} is off by {fmt(float(diff[b, row].max()))}",
                hint=hint())
