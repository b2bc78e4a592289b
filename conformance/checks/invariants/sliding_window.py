"""Sliding window: causal row t sees exactly positions t - W + 1 .. t, W keys, itself included.

Property: for causal attention with a sliding window of W keys, output rows t' >= t are
unchanged (within the unchanged tolerance) when every input at a position <= t - W changes, and
their gradient with respect to those inputs is exactly 0; row t depends on position t - W + 1,
the first key of its window (a non-zero gradient); and with the canonical weights, the attention
measured at zero content logits gives each of positions max(0, t - W + 1) .. t exactly
1 / min(W, t + 1) and every other position exactly 0 (the window's edges are exact).
"""

from __future__ import annotations

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.structure_edges import zero_logit_gap
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.remedies import Remedy
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import abs_error, unchanged_tolerance, worst_index
from conformance.subject.boundary import Inputs

WIDE_HINT = ("the window is one key too wide: is it `i - j <= W` where `i - j < W` is meant "
             "(or does the module count W keys before the row, FlashAttention's "
             "window_size=(W, 0)? then declare that convention)")
NARROW_HINT = ("the window is one key too narrow: is it `i - j < W - 1`, or W keys before the row "
               "counted with the row itself excluded?")


def _perturb_until(inputs: Inputs, cut: int, case: Case) -> Inputs:
    """Every input at positions <= cut replaced with fresh noise."""
    where = torch.zeros(case.batch, case.kv_len, dtype=torch.bool)
    where[:, : cut + 1] = True
    return case.replace_positions(inputs, where, stream=81, scale=3.0, query_too=True)


class SlidingWindow(Check):
    """Row t sees exactly its window of W keys: t - W + 1 .. t."""

    name = "sliding_window"
    order = 210
    applies = "a sliding window"
    title = "sliding window: row t sees exactly t - W + 1 .. t (W keys, edges exact)"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.window is None:
            return Lacking("no sliding window")
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        context.doubt(caps.doubts.window,
                      "behaviour can't tell FlashAttention's count from a window off by one: "
                      "the conventions differ in the wild, a mismatch with one's own argument "
                      "does not", Remedy.to("window_arg", None, "say which count is meant"))
        context.explore(cases(caps, context.device, causal=True, min_len=10, max_len=20),
                        lambda case: self.influence(context, case))
        if caps.weights:
            context.explore(cases(caps, context.device, causal=True, probe=True, min_len=4)
                            .filter(lambda c: c.window is not None and c.q_len > c.window),
                            lambda case: self.edges(context, case))

    def influence(self, context: CheckContext, case: Case) -> None:
        window = case.window
        if window is None or case.q_len <= window:
            return
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        row = window + case.seed % (case.q_len - window)
        cut = row - window  # the last position outside row's window
        before = context.run(instance, inputs, case)
        after = context.run(instance, _perturb_until(inputs, cut, case), case)
        diff = abs_error(after, before)[:, row:]
        tolerance = unchanged_tolerance(context.judged(before.dtype), before)
        if float(diff.max()) > tolerance:
            b, offset, _ = worst_index(diff)
            changed = row + offset
            raise Violation(
                f"with a window of {window} keys, changing inputs at positions <= {cut} changed "
                f"output row {changed} of batch {b} by {fmt(float(diff[b, offset].max()))} "
                f"(tolerance {fmt(tolerance)}); row {changed} sees positions "
                f"{changed - window + 1}..{changed}",
                hint=WIDE_HINT if changed == row else None)

        cotangent = torch.zeros_like(before)
        cotangent[:, row:] = case.tensor(case.batch, case.q_len - row, before.shape[-1],
                                         stream=82)
        gradients = instance.gradients(inputs, cotangent).inputs
        for name, gradient in gradients.items():
            outside = gradient[:, : cut + 1].abs().to(torch.float64).cpu()
            if float(outside.max()) != 0.0:
                b, position, _ = worst_index(outside)
                raise Violation(
                    f"the gradient of rows >= {row} with respect to {name} at position "
                    f"{position}, outside every such row's window of {window} keys (batch {b}), "
                    f"is {fmt(float(outside[b, position].max()))}, not exactly 0",
                    hint=WIDE_HINT if position == cut else None)
        edge = row - window + 1
        cotangent = torch.zeros_like(before)
        cotangent[:, row] = case.tensor(case.batch, before.shape[-1], stream=83)
        gradients = instance.gradients(inputs, cotangent).inputs
        reach = (gradients["x"] if "x" in gradients else gradients["value"])[:, edge]
        if float(reach.abs().max()) == 0.0:
            raise Violation(
                f"output row {row} does not depend on position {edge}, the first of its window "
                f"of {window} keys ({edge}..{row})", hint=NARROW_HINT)

    def edges(self, context: CheckContext, case: Case) -> None:
        gap = zero_logit_gap(context, case)
        if gap is None:
            return
        row, key = gap.row, gap.key
        first = max(0, row - case.window + 1)
        where = "inside" if gap.inside else "outside"
        hint = (WIDE_HINT if key == row - case.window else
                NARROW_HINT if key == first and where == "inside" else None)
        raise Violation(
            f"with zero content logits, row {row} (window of {case.window} keys: positions "
            f"{first}..{row}) gives position {key}, {where} the window, weight "
            f"{fmt(gap.measured)}, expected {fmt(gap.expected)} (batch {gap.batch}, head "
            f"{gap.head})", hint=hint)
