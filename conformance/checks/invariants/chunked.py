"""Chunked: causal row t sees exactly the positions of its own chunk up to itself.

Property: for causal attention in chunks of C positions (Llama 4's chunked attention), the rows
of a chunk that starts at position s = C * k are unchanged (within the unchanged tolerance) when
every input at a position < s changes, and their gradient with respect to those inputs is
exactly 0; the chunk's last row depends on position s, its chunk's first (a non-zero gradient);
and with the canonical weights, the attention measured at zero content logits gives each of
positions C * (t // C) .. t exactly 1 / (t - C * (t // C) + 1) and every other position exactly 0.
The chunk is the one the layer's own argument states or a declaration gives: behaviour alone
can't tell a boundary off by one from another chunk layout.
"""

from __future__ import annotations

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.structure_edges import zero_logit_gap
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import abs_error, unchanged_tolerance, worst_index
from conformance.subject.boundary import Inputs

EARLY_HINT = ("the chunk boundaries sit one position early: are the chunk ids computed from "
              "1-based positions, (t + 1) // C where t // C is meant?")
LATE_HINT = ("the chunk boundaries sit one position late: are the chunk ids computed as "
             "(t - 1) // C where t // C is meant?")


def _chunk_words(start: int, end: int, chunk: int) -> str:
    """The chunk of rows ``start`` .. ``end - 1`` (the case's part of it), in words."""
    return (f"chunks of {chunk} positions: the chunk starting at {start} holds "
            + (f"{start}..{end - 1}" if end - 1 > start else f"{start} alone"))


def _perturb_before(inputs: Inputs, start: int, case: Case) -> Inputs:
    """Every input at positions < start replaced with fresh noise."""
    where = torch.zeros(case.batch, case.kv_len, dtype=torch.bool)
    where[:, :start] = True
    return case.replace_positions(inputs, where, stream=91, scale=3.0, query_too=True)


class Chunked(Check):
    """Row t sees exactly its chunk's positions up to itself: C * (t // C) .. t."""

    name = "chunked"
    order = 220
    applies = "causal chunks"
    title = "causal chunks: row t sees exactly C * (t // C) .. t (boundaries exact)"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.chunk is None:
            return Lacking("no causal chunks")
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        context.explore(cases(caps, context.device, causal=True, min_len=4, max_len=20)
                        .filter(lambda c: c.chunk is not None and c.q_len > c.chunk),
                        lambda case: self.influence(context, case))
        if caps.weights:
            context.explore(cases(caps, context.device, causal=True, probe=True, min_len=3)
                            .filter(lambda c: c.chunk is not None and c.q_len > c.chunk),
                            lambda case: self.edges(context, case))

    def influence(self, context: CheckContext, case: Case) -> None:
        chunk = case.chunk
        if chunk is None or case.q_len <= chunk:
            return
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        start = chunk * (1 + case.seed % ((case.q_len - 1) // chunk))
        end = min(start + chunk, case.q_len)  # the chunk's rows: start .. end - 1
        before = context.run(instance, inputs, case)
        after = context.run(instance, _perturb_before(inputs, start, case), case)
        diff = abs_error(after, before)[:, start:end]
        tolerance = unchanged_tolerance(context.judged(before.dtype), before)
        if float(diff.max()) > tolerance:
            b, offset, _ = worst_index(diff)
            raise Violation(
                f"changing inputs at positions < {start} changed output row {start + offset} of "
                f"batch {b} by {fmt(float(diff[b, offset].max()))} (tolerance {fmt(tolerance)}); "
                f"in {_chunk_words(start, end, chunk)}", hint=EARLY_HINT)

        cotangent = torch.zeros_like(before)
        cotangent[:, start:end] = case.tensor(case.batch, end - start, before.shape[-1],
                                              stream=92)
        gradients = instance.gradients(inputs, cotangent).inputs
        for name, gradient in gradients.items():
            outside = gradient[:, :start].abs().to(torch.float64).cpu()
            if float(outside.max()) != 0.0:
                b, position, _ = worst_index(outside)
                raise Violation(
                    f"the gradient of rows {start}..{end - 1} with respect to {name} at position "
                    f"{position}, before their chunk (batch {b}), is "
                    f"{fmt(float(outside[b, position].max()))}, not exactly 0; in "
                    f"{_chunk_words(start, end, chunk)}",
                    hint=EARLY_HINT if position == start - 1 else None)
        cotangent = torch.zeros_like(before)
        cotangent[:, end - 1] = case.tensor(case.batch, before.shape[-1], stream=93)
        gradients = instance.gradients(inputs, cotangent).inputs
        reach = (gradients["x"] if "x" in gradients else gradients["value"])[:, start]
        if end - 1 > start and float(reach.abs().max()) == 0.0:
            raise Violation(
                f"output row {end - 1} does not depend on position {start}, the first of its "
                f"chunk ({_chunk_words(start, end, chunk)})", hint=LATE_HINT)

    def edges(self, context: CheckContext, case: Case) -> None:
        gap = zero_logit_gap(context, case)
        if gap is None:
            return
        row, key = gap.row, gap.key
        start = row - row % case.chunk
        where = "inside" if gap.inside else "outside"
        hint = (EARLY_HINT if key == start - 1 else
                LATE_HINT if key == start and where == "inside" else None)
        raise Violation(
            f"with zero content logits, row {row} (its chunk's positions {start}..{row}) gives "
            f"position {key}, {where} them, weight {fmt(gap.measured)}, expected "
            f"{fmt(gap.expected)} (batch {gap.batch}, head {gap.head}; chunks of {case.chunk})",
            hint=hint)
