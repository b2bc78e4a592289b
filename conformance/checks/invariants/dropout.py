"""Dropout: off in eval mode, unbiased in train mode, and never a way around a mask.

Property: in eval mode the output is deterministic and, where the rate is configurable, equals
the output at p = 0; train mode at p = 0 equals eval mode; in train mode at p > 0 the mean output
over N independent draws approaches the eval output (each element within z standard errors, z
Bonferroni-corrected for a family-wise false alarm rate of 1e-6, fixed seeds); and in train mode,
with the same random draws, masked keys stay invisible and no row sees a later position.

The draws are taken as replicas along the batch: each of CALLS train-mode calls runs the case's
batch repeated DRAWS / CALLS times, and every replica is one draw (dropout masks are drawn per
element, so replicas are independent draws, and batch independence is the implementation's
contract, checked by ``batch_independence``). Same draws, same test, a thirtieth of the calls.
If every replica of a call comes out identical (a dropout mask shared across the batch would do
that, making replicas dependent), or the batched call fails, the draws are taken one per call.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import expect_finite_rows, fmt
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases, wide_or_own_dtypes
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import abs_error, only_rows, reordering_tolerance, worst_index
from conformance.subject.boundary import ImplementationError, Inputs

DRAWS = 256
CALLS = 8
"""Train-mode calls the DRAWS are spread over, as replicas along the batch."""
FAMILY_ALPHA = 1e-6
CONFIGURED_RATE = 0.3
"""The rate used where it is configurable: high enough that bias shows in a few hundred draws."""


def _replicated(inputs: Inputs, times: int) -> Inputs:
    """``inputs`` with the batch repeated ``times`` times (replica r is rows r*B .. r*B + B-1)."""
    def repeated(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.repeat(times, *([1] * (tensor.dim() - 1)))

    tensors = ((inputs.query,) if inputs.is_self else (inputs.query, inputs.key, inputs.value))
    batched = inputs.with_tensors(*(repeated(t) for t in tensors))
    return batched.with_mask(None if inputs.keep is None else repeated(inputs.keep))


def z_bound(elements: int) -> float:
    """Two-sided Bonferroni z for ``elements`` simultaneous tests at FAMILY_ALPHA."""
    tail = FAMILY_ALPHA / (2 * max(elements, 1))
    return float(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(1 - tail,
                                                                         dtype=torch.float64)))


class Dropout(Check):
    """Eval mode is dropout-free; train mode is unbiased and respects masks and causality."""

    name = "dropout"
    order = 140
    applies = "dropout"
    title = "eval is deterministic and dropout-free; train is unbiased and respects masks"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.dropout == "none":
            return Lacking("no dropout")
        return None

    def _rate(self, context: CheckContext) -> float:
        """The rate cases carry: the configured one, or the module's own (0.0 where unknown:
        the factory ignores it then)."""
        dropout = context.capabilities.dropout
        if dropout == "config":
            return CONFIGURED_RATE
        return 0.0 if dropout == "fixed" else float(dropout)

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        masks = "partly_masked" if caps.mask is not None else "none"
        # Float32 and float64 where it runs in either: the mean of many draws is a statement
        # about exact arithmetic. A kernel that runs in half precision only, in its own: its
        # rounding (eps |o|, 1e-3 to 4e-3) is far below the draws' standard error (~1e-2).
        strategy = cases(caps, context.device, masks=masks, max_len=12,
                         dtypes=wide_or_own_dtypes(caps)).map(
            lambda case: replace(case, dropout=self._rate(context)))
        context.explore(strategy, lambda case: self.eval_mode(context, case))
        context.explore(strategy, lambda case: self.unbiased(context, case), max_examples=4)
        if caps.mask is not None or caps.causality.kind != "never":
            context.explore(strategy, lambda case: self.train_mode_masks(context, case))

    def eval_mode(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        rows = context.rows(case)
        output = context.run(instance, inputs, case)
        again = context.run(instance, inputs, case)
        if float(abs_error(again, output, nan_equal=True).max()) > 0.0:
            raise Violation("two eval-mode calls differ: dropout is active in eval mode",
                            hint="F.dropout(x, p) defaults to training=True: pass "
                                 "training=self.training, or use nn.Dropout")
        if context.capabilities.dropout != "config":
            return
        plain = context.build(replace(case, dropout=0.0))
        without = context.run(plain, inputs, case)
        diff = only_rows(abs_error(without, output, nan_equal=True), rows)
        if float(diff.max()) > 0.0:
            raise Violation(f"eval mode at p = {case.dropout} differs from p = 0 by "
                            f"{fmt(float(diff.max()))}: dropout acts in eval mode")
        trained = plain.forward(inputs, training=True, seed=1)
        diff = only_rows(abs_error(trained, without, nan_equal=True), rows)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), without)
        if float(diff.max()) > tolerance:
            b, row, _ = worst_index(diff)
            raise Violation(f"train mode at p = 0 differs from eval mode (row {row} of batch {b}, "
                            f"by {fmt(float(diff.max()))})")

    def unbiased(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        rows = context.rows(case)
        expected = context.run(instance, inputs, case).to(torch.float64).cpu()
        expect_finite_rows(expected, rows)
        draws = self._draws(instance, inputs, case)
        mean = draws.mean(0)
        standard_error = draws.std(0) / math.sqrt(DRAWS)
        bound = z_bound(int(rows.sum()) * case.d_model)
        allowed = bound * standard_error + reordering_tolerance(
            context.judged(case.config.dtype), expected)
        # NaN (a draw that produced one) must fail, not compare false.
        excess = only_rows(torch.nan_to_num(((mean - expected).abs() - allowed).clamp_min(0),
                                            nan=float("inf")), rows)
        if float(excess.max()) > 0.0:
            b, row, feature = worst_index(excess)
            raise Violation(
                f"in train mode (p = {case.dropout or 'its own'}) the mean of {DRAWS} draws is "
                f"{fmt(float(mean[b, row, feature]))} where eval mode gives "
                f"{fmt(float(expected[b, row, feature]))} (batch {b}, row {row}, feature "
                f"{feature}; {fmt(bound)} standard errors = {fmt(float(allowed[b, row, feature]))})",
                hint=context.hint(lambda: self._bias_cause(context, case, instance, inputs,
                                                           expected)))

    @staticmethod
    def _bias_cause(context: CheckContext, case: Case, instance, inputs: Inputs,
                    expected: torch.Tensor) -> str | None:
        """Why the mean of the draws is off, where measured: the draws run as replicas along
        the batch, so a module whose eval output changes when the batch is replicated is off
        for that reason (batch elements see each other); one whose eval output does not is
        off in train mode alone, which is dropout's doing."""
        try:
            replicas = DRAWS // CALLS
            batched = instance.forward(_replicated(inputs, replicas)).to(torch.float64).cpu()
        except ImplementationError:
            return None
        batched = batched.reshape(replicas, *expected.shape)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), expected)
        rows = context.rows(case)
        if float(only_rows(abs_error(batched, expected.expand_as(batched), nan_equal=True)
                           .amax(dim=0), rows).max()) > tolerance:
            return ("in eval mode the output changes when the batch is repeated: batch elements "
                    "see each other (see batch_independence), so the draws taken along the "
                    "batch are not independent")
        return ("eval mode is right and unchanged by a repeated batch, train mode is biased: is "
                "dropout applied to the logits, or without the 1/(1 - p) rescaling?")

    @staticmethod
    def _draws(instance, inputs: Inputs, case: Case) -> torch.Tensor:
        """DRAWS train-mode outputs (DRAWS, B, Lq, D) in float64: replicas along the batch in
        CALLS calls where they are independent, else one call per draw."""
        replicas = DRAWS // CALLS
        batched = _replicated(inputs, replicas)
        try:
            calls = [instance.forward(batched, training=True, seed=1000 + k)
                     .to(torch.float64).cpu().reshape(replicas, *inputs.query.shape[:2], -1)
                     for k in range(CALLS)]
        except ImplementationError:
            calls = []
        if calls and all(not bool((call == call[:1]).all()) for call in calls):
            return torch.cat(calls)
        return torch.stack([instance.forward(inputs, training=True, seed=1000 + k)
                            .to(torch.float64).cpu() for k in range(DRAWS)])

    def train_mode_masks(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        rows = context.rows(case)
        before = instance.forward(inputs, training=True, seed=7)
        try:
            expect_finite_rows(before, rows)
        except Violation as violation:
            violation.hint = context.hint(lambda: self._nan_cause(context, case, instance,
                                                                  inputs, rows))
            raise
        if inputs.keep is not None:
            masked = ~inputs.keep.cpu()
            compared = rows & inputs.keep.cpu() if inputs.is_self else rows
            changed = case.replace_positions(inputs, masked, stream=81, scale=10.0)
            after = instance.forward(changed, training=True, seed=7)
            diff = only_rows(abs_error(after, before, nan_equal=True), compared)
            if float(diff.max()) > 0.0:
                b, row, _ = worst_index(diff)
                raise Violation(
                    f"in train mode, changing masked key/value inputs changed output row {row} of "
                    f"batch {b} by {fmt(float(diff[b, row].max()))}",
                    hint=context.hint(lambda: self._train_only(
                        context, case, instance, inputs, changed, compared,
                        "eval mode ignores the masked keys, train mode does not: does dropout on "
                        "the logits turn a masked -inf/-1e20 into 0? Apply dropout to the "
                        "weights after the softmax", "padding")))
        if case.causal and case.q_len >= 2:
            cut = case.seed % (case.q_len - 1)
            later = torch.zeros(case.batch, case.kv_len, dtype=torch.bool)
            later[:, cut + 1:] = True
            changed = case.replace_positions(inputs, later, stream=81, scale=10.0)
            after = instance.forward(changed, training=True, seed=7)
            diff = only_rows(abs_error(after, before, nan_equal=True)[:, : cut + 1],
                             rows[:, : cut + 1])
            if float(diff.max()) > 0.0:
                earlier = rows.clone()
                earlier[:, cut + 1:] = False
                raise Violation(f"in train mode, changing inputs after position {cut} changed an "
                                "earlier output row",
                                hint=context.hint(lambda: self._train_only(
                                    context, case, instance, inputs, changed, earlier,
                                    "eval mode is causal, train mode is not: dropout on the "
                                    "logits undoes the causal mask? Apply dropout to the "
                                    "weights after the softmax", "causal")))

    @staticmethod
    def _nan_cause(context: CheckContext, case: Case, instance, inputs: Inputs,
                   rows: torch.Tensor) -> str:
        """Whether train mode alone makes the rows non-finite (dropout's doing)."""
        output = context.run(instance, inputs, case)
        if bool(torch.isfinite(output).all(dim=-1).cpu()[rows].all()):
            return ("finite in eval mode, not in train mode: does dropout on the logits turn a "
                    "masked -inf into NaN (-inf * 0)? Apply dropout after the softmax")
        return "not finite in eval mode either (see padding and fully_masked)"

    @staticmethod
    def _train_only(context: CheckContext, case: Case, instance, inputs: Inputs,
                    changed: Inputs, rows: torch.Tensor, hint: str, check: str) -> str:
        """``hint`` where the same change leaves the ``rows`` unchanged in eval mode (the leak is
        train mode's alone), else a pointer to the ``check`` that sees it in eval mode."""
        before = context.run(instance, inputs, case)
        after = context.run(instance, changed, case)
        tolerance = reordering_tolerance(context.judged(case.config.dtype), before)
        if float(only_rows(abs_error(after, before, nan_equal=True), rows).max()) <= tolerance:
            return hint
        return f"eval mode shows the same leak (see {check}): it is not dropout's"
