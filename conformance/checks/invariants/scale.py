"""Scale: the logits are scaled by 1/sqrt(head_dim).

Property: the measured attention weights are softmax(s * q_i . k_j) over the keys, and the scale
fitted from them (log A_ij - log A_ik = s (q_i . k_j - q_i . k_k), least squares over every row)
is 1/sqrt(head_dim) within 1% (plus two units in the last place of the dtype measured in).
Measured in float32 / float64 where it runs in either: the scale belongs to the algorithm. A
kernel that runs in half precision only is measured there, from its weights above the dtype's
smallest normal number (below it a weight's log is too coarse to fit), with the log-weight
residual allowed the dtype's rounding of logits and weights. When the fitted scale is another
recognisable one (1/sqrt(d_model), 1, 1/head_dim, 1/sqrt(num_heads), sqrt(head_dim)), the report
says which.
"""

from __future__ import annotations

import math

import torch

from conformance.checks.diagnosis import scale_groups
from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.row_stochastic import QUERY_AXIS, over_queries
from conformance.checks.invariants.verify import fmt, position_skip_reason
from conformance.checks.invariants.violation import Violation
from conformance.checks.probes import probe
from conformance.generation.cases import Case
from conformance.generation.strategies import (
    WIDE_DTYPES,
    cases,
    heads_apart,
    wide_or_own_dtypes,
)
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import eps

RESIDUAL = 0.05
"""Largest log-weight residual of a softmax of scaled dot products in float32/float64; a softmax
over the wrong axis, or of something else, leaves far more."""

RESIDUAL_ULPS = 16
"""Units in the last place added to RESIDUAL in a dtype: a half-precision kernel rounds its
logits (q.k of magnitude ~3 at relative eps/2 each) and its weights (relative eps/2)."""


def fit_scale(attention: torch.Tensor, logits: torch.Tensor,
              rows: torch.Tensor, bias: torch.Tensor | None = None,
              smallest: float = 0.0) -> tuple[float, float]:
    """Least-squares s in log A = s * logits + bias + c(row), over rows (B, Lq) and weights
    above ``smallest`` (``bias``: a position encoding's unscaled logit bias, ALiBi's).

    Returns (s, largest residual of log A): a large residual means the weights are not a softmax
    of scaled dot products at all.
    """
    usable = (attention > smallest) & rows[:, None, :, None] & torch.isfinite(attention)
    log_a = attention.clamp_min(1e-300).log()
    if bias is not None:
        log_a = log_a - bias
    log_a = torch.where(usable, log_a, 0.0)
    count = usable.sum(-1, keepdim=True).clamp_min(1)
    x_mean = (logits * usable).sum(-1, keepdim=True) / count
    y_mean = (log_a * usable).sum(-1, keepdim=True) / count
    dx = (logits - x_mean) * usable
    dy = (log_a - y_mean) * usable
    denominator = float((dx * dx).sum())
    if denominator == 0.0:
        return float("nan"), 0.0
    s = float((dx * dy).sum()) / denominator
    residual = float(((dy - s * dx) * usable).abs().max())
    return s, residual


class Scale(Check):
    """The logit scale fitted from the measured attention is 1/sqrt(head_dim)."""

    name = "scale"
    title = "logits are scaled by 1/sqrt(head_dim)"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if position_skip_reason(capabilities):
            return position_skip_reason(capabilities)
        if not capabilities.weights:
            return "needs canonical weight access to measure the attention matrix"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        # Sizes where the recognisable scales are all different from each other (where the
        # module builds for any such).
        apart = heads_apart(caps)
        strategy = cases(caps, context.device, probe=True, min_heads=2, min_len=2,
                         dtypes=wide_or_own_dtypes(caps)).filter(
            lambda c: c.head_dim >= 2 and (c.head_dim != c.num_heads or not apart))
        context.explore(strategy, lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        measured = probe(context.build(case), case, context.capabilities.call,
                         causal=case.causal, encoding=context.capabilities.encoding)
        rows = context.rows(case)
        dtype = case.config.dtype
        smallest = 0.0 if dtype in WIDE_DTYPES else torch.finfo(dtype).tiny
        fitted, residual = fit_scale(measured.attention, measured.logits, rows, measured.bias,
                                     smallest)
        if math.isnan(fitted) and residual == 0.0:
            return  # no row sees two keys (a window of one key): nothing to fit a scale to
        expected = 1 / math.sqrt(case.head_dim)
        tolerance = 0.01 + 2 * eps(dtype)
        if residual > RESIDUAL + RESIDUAL_ULPS * eps(dtype) or math.isnan(fitted):
            raise Violation(
                "the attention weights are not softmax(s * q.k) over the keys for any single "
                f"scale s (log-weight residual {fmt(residual)})",
                hint=QUERY_AXIS if over_queries(
                    measured.attention, 2 * (case.kv_len + 2) * eps(case.config.dtype)) else None)
        if abs(fitted - expected) <= tolerance * expected:
            return
        hint = None
        for words, candidate in scale_groups(case.head_dim, case.num_heads):
            if abs(fitted - candidate) <= tolerance * candidate:
                hint = f"matches scale {words}"
        raise Violation(f"the fitted logit scale is {fmt(fitted)}, expected 1/sqrt(head_dim) = "
                        f"1/sqrt({case.head_dim}) = {fmt(expected)}", hint=hint)
