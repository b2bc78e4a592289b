"""Row-stochastic softmax: every attention row is a probability distribution over the keys.

Property: in eval mode, every attention weight A[b, h, i, j] >= 0, and every query row with at
least one key to attend to sums to 1 over the keys: sum_j A[b, h, i, j] = 1 (within
2 (Lk + 2) eps). A is measured on the implementation's own forward through the attention-matrix
probe (:mod:`conformance.checks.probes`), whether it calls ``torch.softmax``, a hand-written exp/sum or
SDPA.
"""

from __future__ import annotations

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Violation
from conformance.checks.mask_mistakes import named
from conformance.checks.probes import measure_attention
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import eps, worst_index

QUERY_AXIS = "rows sum to 1 along the query axis: softmax over the wrong dimension?"


def over_queries(attention: torch.Tensor, tolerance: float) -> bool:
    """Whether measured weights (B, H, Lq, Lk) are a softmax over the query axis: every column
    with finite weights sums to 1 over the queries, and some column is finite (Lq > 1: with one
    query both axes sum to 1)."""
    if attention.shape[-2] < 2:
        return False
    columns = attention.sum(dim=-2)
    finite = torch.isfinite(columns)
    return bool(finite.any()) and float((columns[finite] - 1).abs().max()) <= tolerance


class RowStochastic(Check):
    """Attention weights are >= 0 and each row sums to 1."""

    name = "row_stochastic"
    title = "attention weights are >= 0 and every row sums to 1"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if not capabilities.weights:
            return "needs canonical weight access to measure the attention matrix"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        context.explore(cases(caps, context.device, masks="auto",
                              causal=caps.causal == "always", probe=True),
                        lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        keep = case.keep()
        measured = measure_attention(context.build(case), case, context.capabilities.call,
                                     keep=keep, causal=case.causal)
        # Rows with no key to attend to are the padding check's business.
        attention = measured.masked_fill(~context.rows(case)[:, None, :, None], 0.0)
        rows_sum = context.rows(case)[:, None, :].expand(attention.shape[:3])
        nan = torch.isnan(attention)
        tolerance = 2 * (case.kv_len + 2) * eps(context.judged(case.config.dtype))
        if bool(nan.any()):
            b, h, row, key = (int(i) for i in torch.nonzero(nan)[0])
            raise Violation(f"batch {b}, head {h}, row {row} has NaN attention weights (key "
                            f"{key}), though the row has keys to attend to",
                            hint=context.hint(lambda: self._mistake(context, case, measured,
                                                                    tolerance)))
        negative = (-attention).clamp(min=0)
        if float(negative.max()) > tolerance:
            b, h, row, key = worst_index(negative)
            raise Violation(f"batch {b}, head {h}, row {row} gives key {key} a negative weight "
                            f"{fmt(float(attention[b, h, row, key]))}")
        sums = attention.sum(dim=-1)
        off = torch.where(rows_sum, (sums - 1).abs(), 0.0)
        if float(off.max()) <= tolerance:
            return
        b, h, row = worst_index(off)
        raise Violation(
            f"batch {b}, head {h}, row {row} sums to {fmt(float(sums[b, h, row]))}, not 1 "
            f"(tolerance {fmt(tolerance)})",
            details=["weights of that row: " + ", ".join(
                fmt(float(w)) for w in attention[b, h, row])],
            hint=context.hint(lambda: self._mistake(context, case, measured, tolerance)))

    @staticmethod
    def _mistake(context: CheckContext, case: Case, measured: torch.Tensor,
                 tolerance: float) -> str | None:
        """The bug the measured weights ``measured`` (B, H, Lq, Lk, every row) show: a softmax
        over the query axis (every finite column sums to 1 over the queries), or a mask mistake
        the module's output reproduces (see CheckContext.mask_mistake); else None."""
        if over_queries(measured, tolerance):
            return QUERY_AXIS
        return named(context.mask_mistake(case))
