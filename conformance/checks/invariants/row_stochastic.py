"""Row-stochastic softmax: every attention row is a probability distribution over the keys.

Property: in eval mode, every attention weight A[b, h, i, j] >= 0, and every query row with at
least one key to attend to sums to 1 over the keys: sum_j A[b, h, i, j] = 1 (within
2 (Lk + 2) eps). A is measured on the implementation's own forward through the attention-matrix
probe (:mod:`conformance.inference.observing.attention_probe`), whether it calls
``torch.softmax``, a hand-written exp/sum or SDPA.

Through the core (where no weight layout applies): at every attention core its forward computes,
the softmax normalises over the keys (the axis its weights are contracted with the values over),
and the weights that multiply the values, after whatever the forward does to the probabilities,
are >= 0 and sum to 1 over the keys on every row attention specifies, within the same tolerance.
Two maps combined (differential attention) are each a softmax over the keys, their combination
weighs nothing that must sum to 1; sinks take their share of a row, which then sums to at most 1.
"""

from __future__ import annotations

import torch

from conformance.checks.core_route import (
    NO_WEIGHTS,
    core_cases,
    core_words,
    require_core,
    sites_of,
)
from conformance.checks.diagnosis import SOFTMAX_OVER_QUERIES
from conformance.checks.invariants.base import Check, CheckContext, Structure
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Violation
from conformance.checks.mask_mistakes import named
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.inference.observing.attention_probe import measure_attention
from conformance.model.core import AttentionSite
from conformance.model.results import Route
from conformance.numerics.tolerance import eps, worst_index

MASK_AFTER_SOFTMAX = ("the weights are the softmax's probabilities times the padding mask: the mask "
                      "is applied after the softmax, so the kept keys' weights no longer sum to 1 "
                      "(mask the logits with -inf before the softmax)")
COMBINED = ("the values are weighted by softmax maps combined (differential attention): each "
            "map is checked to normalise over the keys; their combination need not sum to 1")
SINKS = ("the softmax spans columns beyond the keys (attention sinks): a row's weights on the "
         "keys sum to at most 1, the sinks taking the rest")


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
    order = 40
    applies = "every implementation"
    title = "attention weights are >= 0 and every row sums to 1"
    requires = frozenset({Structure.SOFTMAX})
    judged = "rows summing to 1"

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        if not caps.weights:
            require_core(context, NO_WEIGHTS)
            context.explore(core_cases(caps, context.device, masks="auto",
                                       causal=caps.causality.kind == "always"),
                            lambda case: self.verify_core(context, case))
            return
        context.route = Route.WEIGHTS
        context.explore(cases(caps, context.device, masks="auto",
                              causal=caps.causality.kind == "always", probe=True),
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

    def verify_core(self, context: CheckContext, case: Case) -> None:
        found = sites_of(context.build(case), case.inputs(context.capabilities.call), case)
        rows = context.rows(case)[0]  # one mask for the batch: the same rows in every group
        tolerance = 2 * (case.kv_len + 2) * eps(context.judged(case.config.dtype))
        for index, site in enumerate(found):
            where = core_words(site, index, len(found))
            if site.over_keys is False:
                raise Violation(f"{where}: the softmax normalises over another axis than the keys "
                                "its weights are contracted with the values over", hint=SOFTMAX_OVER_QUERIES)
            if site.used is None:
                continue  # SDPA normalises over the keys by construction
            if site.combined > 1:
                context.observe(COMBINED)
                continue
            used = site.used.to(torch.float64)[:, rows]
            if bool(torch.isnan(used).any()):
                group, row, key = (int(i) for i in torch.nonzero(torch.isnan(used))[0])
                raise Violation(f"{where}: group {group}, row {_row(rows, row)} has NaN weights "
                                f"(key {key}), though the row has keys to attend to")
            negative = (-used).clamp(min=0)
            if _largest(negative) > tolerance:
                group, row, key = worst_index(negative)
                raise Violation(f"{where}: group {group}, row {_row(rows, row)} gives key {key} a "
                                f"negative weight {fmt(float(used[group, row, key]))}")
            sums = used.sum(dim=-1)
            if site.sinks:
                context.observe(SINKS)
                off = (sums - 1).clamp(min=0)
            else:
                off = (sums - 1).abs()
            if _largest(off) <= tolerance:
                continue
            group, row = worst_index(off)
            raise Violation(
                f"{where}: group {group}, row {_row(rows, row)} of the weights that multiply the "
                f"values sums to {fmt(float(sums[group, row]))}, not 1 (tolerance {fmt(tolerance)})",
                details=["weights of that row: " + ", ".join(
                    fmt(float(w)) for w in used[group, row])],
                hint=_masked_after(site, case, rows, tolerance))

    @staticmethod
    def _mistake(context: CheckContext, case: Case, measured: torch.Tensor,
                 tolerance: float) -> str | None:
        """The bug the measured weights ``measured`` (B, H, Lq, Lk, every row) show: a softmax
        over the query axis (every finite column sums to 1 over the queries), or a mask mistake
        the module's output reproduces (see CheckContext.mask_mistake); else None."""
        if over_queries(measured, tolerance):
            return SOFTMAX_OVER_QUERIES
        return named(context.mask_mistake(case))


def _largest(values: torch.Tensor) -> float:
    return float(values.max()) if values.numel() else 0.0


def _row(rows: torch.Tensor, index: int) -> int:
    """The query position of the ``index``-th judged row."""
    return int(torch.nonzero(rows)[index])


def _masked_after(site: AttentionSite, case: Case, rows: torch.Tensor,
                  tolerance: float) -> str | None:
    """MASK_AFTER_SOFTMAX where the weights are the probabilities times the padding mask."""
    keep = case.keep()
    if keep is None or site.probabilities is None or site.used.shape != site.probabilities.shape:
        return None
    masked = site.probabilities.to(torch.float64) * keep[0].cpu().to(torch.float64)
    if float((masked - site.used.to(torch.float64))[:, rows].abs().max()) <= tolerance:
        return MASK_AFTER_SOFTMAX
    return None
