"""Scale: the logits are scaled by 1/sqrt(head_dim).

Property: the measured attention weights are softmax(s * q_i . k_j) over the keys, and the scale
fitted from them (log A_ij - log A_ik = s (q_i . k_j - q_i . k_k), least squares over every row)
is 1/sqrt(head_dim) within 1%. Measured in float32 / float64: the scale belongs to the
algorithm, and the logs of small half-precision weights are too coarse to fit it (half precision
is judged by ``low_precision`` and ``stability``). When the fitted scale is another recognisable
one (1/sqrt(d_model), 1, 1/head_dim, 1/sqrt(num_heads), sqrt(head_dim)), the report says which.
"""

from __future__ import annotations

import math

import torch

from conformance.checks.diagnosis import scale_candidates
from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.row_stochastic import QUERY_AXIS, over_queries
from conformance.checks.invariants.verify import fmt, position_skip_reason
from conformance.checks.invariants.violation import Violation
from conformance.checks.probes import probe
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import eps


def fit_scale(attention: torch.Tensor, logits: torch.Tensor,
              rows: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[float, float]:
    """Least-squares s in log A = s * logits + bias + c(row), over rows (B, Lq) and positive
    weights (``bias``: a position encoding's unscaled logit bias, ALiBi's).

    Returns (s, largest residual of log A): a large residual means the weights are not a softmax
    of scaled dot products at all.
    """
    usable = (attention > 0) & rows[:, None, :, None] & torch.isfinite(attention)
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
        if not {torch.float32, torch.float64} & set(capabilities.dtypes):
            return "measured in float32 or float64, and it declares neither"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        # Sizes where the recognisable scales are all different from each other.
        strategy = cases(caps, context.device, probe=True, min_heads=2, min_len=2,
                         dtypes=(torch.float32, torch.float64)).filter(
            lambda c: c.head_dim >= 2 and c.head_dim != c.num_heads)
        context.explore(strategy, lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        measured = probe(context.build(case), case, context.capabilities.call,
                         causal=case.causal, encoding=context.capabilities.encoding)
        rows = context.rows(case)
        fitted, residual = fit_scale(measured.attention, measured.logits, rows, measured.bias)
        if math.isnan(fitted) and residual == 0.0:
            return  # no row sees two keys (a window of one key): nothing to fit a scale to
        expected = 1 / math.sqrt(case.head_dim)
        tolerance = 0.01
        if residual > 0.05 or math.isnan(fitted):
            raise Violation(
                "the attention weights are not softmax(s * q.k) over the keys for any single "
                f"scale s (log-weight residual {fmt(residual)})",
                hint=QUERY_AXIS if over_queries(
                    measured.attention, 2 * (case.kv_len + 2) * eps(case.config.dtype)) else None)
        if abs(fitted - expected) <= tolerance * expected:
            return
        hint = None
        for words, candidate in scale_candidates(case.head_dim, case.num_heads).items():
            if abs(fitted - candidate) <= tolerance * candidate:
                hint = f"matches scale {words}"
        raise Violation(f"the fitted logit scale is {fmt(fitted)}, expected 1/sqrt(head_dim) = "
                        f"1/sqrt({case.head_dim}) = {fmt(expected)}", hint=hint)
