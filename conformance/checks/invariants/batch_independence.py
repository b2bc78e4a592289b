"""Batch independence: batch elements never see each other.

Property: changing the inputs of one batch element leaves every other element's output
bit-for-bit unchanged, and each element's output equals the output of that element run alone
(within the reordering tolerance). Cases use pairwise-distinct batch size, lengths, head count
and head_dim, so no shape coincidence hides a mix-up of dimensions.
"""

from __future__ import annotations

import torch

from conformance.checks.diagnosis import BATCH_HEADS_MIXED, batch_heads_mixed, reproduces
from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.platform import platform_or
from conformance.checks.invariants.verify import fmt, reference_applies
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases, distinct_sizes, heads_apart
from conformance.numerics.reference import reference_attention
from conformance.numerics.tolerance import abs_error, only_rows, reordering_tolerance, worst_index
from conformance.subject.boundary import Inputs


def _element(inputs: Inputs, b: int) -> Inputs:
    keep = None if inputs.keep is None else inputs.keep[b : b + 1]
    single = inputs.with_tensors(inputs.query[b : b + 1], inputs.key[b : b + 1],
                                 inputs.value[b : b + 1])
    return single.with_mask(keep)


def _replace_element(inputs: Inputs, b: int, case: Case) -> Inputs:
    def replaced(tensor: torch.Tensor, stream: int) -> torch.Tensor:
        changed = tensor.clone()
        changed[b] = case.tensor(*tensor.shape[1:], stream=stream, scale=3.0)
        return changed

    if inputs.is_self:
        return inputs.with_tensors(replaced(inputs.query, 61))
    return inputs.with_tensors(replaced(inputs.query, 61), replaced(inputs.key, 62),
                               replaced(inputs.value, 63))


class BatchIndependence(Check):
    """Batch elements never influence each other; batched equals one at a time."""

    name = "batch_independence"
    order = 110
    applies = "every implementation"
    title = "batch elements never influence each other; batched equals one at a time"

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        strategy = cases(caps, context.device, min_batch=2,
                         masks="auto").filter(
            lambda case: distinct_sizes(case, heads_apart=heads_apart(caps)))
        context.explore(strategy, lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        try:
            self._independent(context, case)
        except Violation as violation:
            raise platform_or(context, case, violation,
                                      lambda other: self._independent(context, other)) \
                from violation

    def _independent(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        output = context.run(instance, inputs, case)
        changed = case.seed % case.batch
        others = [b for b in range(case.batch) if b != changed]
        after = context.run(instance, _replace_element(inputs, changed, case), case)
        diff = abs_error(after[others], output[others], nan_equal=True)
        if float(diff.max()) > 0.0:
            i, row, _ = worst_index(diff)
            raise Violation(
                f"changing batch element {changed} changed element {others[i]} (row {row}, by "
                f"{fmt(float(diff[i, row].max()))})",
                hint=context.hint(lambda: self._mixing(context, case, instance, inputs, output,
                                                       after[others], output[others])))

        rows = context.rows(case)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), output)
        for b in range(case.batch):
            alone = context.run(instance, _element(inputs, b), case)
            diff = only_rows(abs_error(alone[0:1], output[b : b + 1], nan_equal=True),
                             rows[b : b + 1])
            if float(diff.max()) > tolerance:
                _, row, _ = worst_index(diff)
                raise Violation(
                    f"batch element {b} run alone differs from the batched run (row {row}, by "
                    f"{fmt(float(diff.max()))}, allowed {fmt(tolerance)})")

    @staticmethod
    def _mixing(context: CheckContext, case: Case, instance, inputs: Inputs,
                output: torch.Tensor, after: torch.Tensor, before: torch.Tensor) -> str | None:
        """How batch elements reach each other, where the behaviour shows it: the output is
        attention with the heads split by reshape(H, B, L, Dh) (with weight access); or the
        other elements' outputs all moved by one common factor about one common point (a
        reduction over the whole batch, as a norm or mean without dim= gives); else None."""
        if reference_applies(context.capabilities):
            weights, encoding = instance.read_weights(), context.capabilities.position.encoding
            variant = batch_heads_mixed(weights, inputs, causal=case.causal, window=case.window,
                                        chunk=case.chunk, encoding=encoding)
            correct = reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                          keep=inputs.keep, causal=case.causal,
                                          window=case.window, chunk=case.chunk, encoding=encoding,
                                          start=inputs.position).output
            if reproduces(output, variant, correct, context.rows(case)):
                return BATCH_HEADS_MIXED
        # One common factor about one common point per feature (the output projection's bias
        # is not scaled): a[., f] = s b[., f] + t[f], s the same for every feature.
        a = after.detach().to(torch.float64).cpu().reshape(-1, after.shape[-1])
        b = before.detach().to(torch.float64).cpu().reshape(-1, before.shape[-1])
        if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(b).all())):
            return None
        a, b = a - a.mean(dim=0), b - b.mean(dim=0)
        spread = float(b.abs().max())
        if spread == 0.0 or float((a - b).abs().max()) == 0.0:
            return None
        factor = float((a * b).sum() / (b * b).sum())
        if float((a - factor * b).abs().max()) <= reordering_tolerance(
                context.judged(case.config.dtype), before):
            return ("every other element's output moved by one common factor about one common "
                    "point: a reduction over the whole batch (a norm or mean without dim=)?")
        return None
