"""Packed variable-length sequences: each sequence packed with others gives what it gives alone.

Property: tokens of n sequences of lengths l_1 .. l_n packed along one batch element (passed as
cu_seqlens = [0, l_1, l_1 + l_2, ...], or as a block-diagonal mask) give, for every sequence,
the output of that sequence run alone (within the reordering tolerance); and changing one
sequence's tokens changes no other sequence's outputs (within the unchanged tolerance). A varlen
kernel is given an empty sequence among them too (a boundary repeated in cu_seqlens).
"""

from __future__ import annotations

from itertools import pairwise

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import abs_error, reordering_tolerance, unchanged_tolerance, worst_index
from conformance.subject.boundary import Inputs

OFF_BY_ONE_HINT = ("a token at a sequence boundary is counted in the wrong sequence: are the "
                   "boundaries read from cu_seqlens off by one (searchsorted's side, a missing "
                   "leading 0)?")


def segments(case: Case, empty: bool = False) -> tuple[int, ...]:
    """Two to four sequence lengths (each >= 1) summing to the case's length, from its seed;
    ``empty``: with an empty sequence after the first (cu_seqlens repeats a boundary)."""
    generator = torch.Generator().manual_seed(case.seed + 101)
    count = min(case.q_len, 2 + case.seed % 3)
    cuts = sorted(torch.randperm(case.q_len - 1, generator=generator)[: count - 1].add(1)
                  .tolist())
    bounds = [0, *cuts, case.q_len]
    lengths = tuple(end - start for start, end in pairwise(bounds))
    return (lengths[0], 0, *lengths[1:]) if empty else lengths


class Packed(Check):
    """Packed sequences give what each gives alone; none influences another."""

    name = "packed"
    order = 240
    applies = "packed sequences (cu_seqlens or a block-diagonal mask)"
    title = "packed sequences (cu_seqlens / block-diagonal mask) = each sequence alone"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.packing.form is None:
            return Lacking("no packed sequences (cu_seqlens or a block-diagonal mask)")
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        context.explore(cases(caps, context.device, min_len=2, max_batch=1, cross=False),
                        lambda case: self.verify(context, case))

    def _inputs(self, context: CheckContext, x: torch.Tensor, case: Case,
                lengths: tuple[int, ...] | None) -> Inputs:
        if context.capabilities.call == "self":
            inputs = Inputs.self_attention(x, causal=case.causal)
        else:
            inputs = Inputs(x, x.clone(), x.clone(), causal=case.causal)
        return Inputs(inputs.query, inputs.key, inputs.value, causal=case.causal,
                      segments=lengths)

    def verify(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        kernel = context.capabilities.kernel
        lengths = segments(case, empty=kernel is not None and kernel.varlen)
        x = case.tensor(1, case.q_len, case.d_model)
        packed = instance.forward(self._inputs(context, x, case, lengths))
        if tuple(packed.shape) != tuple(x.shape):
            raise Violation(f"packed output has shape {tuple(packed.shape)}, expected "
                            f"{tuple(x.shape)}")
        dtype = context.judged(case.config.dtype)
        tolerance = reordering_tolerance(dtype, packed)
        start = 0
        for index, length in enumerate(lengths):
            if not length:
                continue  # an empty sequence: nothing of its own to compare
            alone = context.run(instance, self._inputs(context, x[:, start:start + length],
                                                       case, None), case)
            diff = abs_error(packed[:, start:start + length], alone)
            if float(diff.max()) > tolerance:
                _, row, _ = worst_index(diff)
                boundary = row in (0, length - 1)
                raise Violation(
                    f"sequence {index} (positions {start}..{start + length - 1} of lengths "
                    f"{list(lengths)}) packed differs from it run alone at its row {row} by "
                    f"{fmt(float(diff[0, row].max()))} (allowed {fmt(tolerance)})",
                    hint=OFF_BY_ONE_HINT if boundary else
                    "does attention cross sequence boundaries (the mask or cu_seqlens ignored)?")
            start += length

        # Influence: change every token of one sequence; the others must not move.
        victim = [i for i, length in enumerate(lengths) if length][case.seed % len(
            [length for length in lengths if length])]
        first = sum(lengths[:victim])
        where = torch.zeros(1, case.q_len, dtype=torch.bool)
        where[:, first:first + lengths[victim]] = True
        changed = case.replace_positions(Inputs.self_attention(x), where, stream=91, scale=3.0)
        after = instance.forward(self._inputs(context, changed.query, case, lengths))
        diff = abs_error(after, packed)
        diff[:, first:first + lengths[victim]] = 0.0
        allowed = unchanged_tolerance(dtype, packed)
        if float(diff.max()) > allowed:
            _, position, _ = worst_index(diff)
            raise Violation(
                f"changing sequence {victim}'s tokens (positions {first}.."
                f"{first + lengths[victim] - 1}) changed position {position}, in another "
                f"sequence, by {fmt(float(diff[0, position].max()))} (tolerance {fmt(allowed)})",
                hint=OFF_BY_ONE_HINT if position in (first - 1, first + lengths[victim]) else
                "does attention cross sequence boundaries?")
