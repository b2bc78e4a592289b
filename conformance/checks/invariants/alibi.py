"""ALiBi: the logits carry a per-head linear distance penalty, with the paper's slopes where
declared.

Property: with the query and key projections zeroed (every content logit 0) the measured
attention is softmax over the keys of the position bias alone, and for every head h, row i and
visible key j, log A[h, i, j] - log A[h, i, i] = -m_h d(i, j), with d = i - j (causal) or |i - j|
(bidirectional) and one slope m_h > 0 per head (fitted by least squares; the largest residual
within 1000 eps of the log-weights' size). Where the standard slopes are declared,
m_h = 2^(-8 (h + 1) / H) for H a power of two, and the paper's interpolation otherwise (the
slopes of the nearest smaller power of two, then every other slope of the next larger one).
Measured in float32 / float64, on the attention-matrix probe
(:mod:`conformance.inference.observing.attention_probe`).
"""

from __future__ import annotations

import math

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases, wide_dtypes
from conformance.inference.observing.attention_probe import measure_attention
from conformance.model.spec import Capabilities
from conformance.numerics.position_encoding import head_slopes, standard_slopes
from conformance.numerics.reference import allowed_keys
from conformance.numerics.tolerance import eps

RESIDUAL_ULPS = 1000.0


def fit_slopes(attention: torch.Tensor, visible: torch.Tensor,
               distance: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """Per-head m in log A[h, i, j] - log A[h, i, i] = -m d(i, j), least squares over the visible
    keys of every row of ``attention`` (B, H, Lq, Lk); (slopes (H,), largest residual, largest
    |log-weight difference|)."""
    log_a = attention.clamp_min(1e-300).log()
    diagonal = torch.diagonal(log_a, dim1=-2, dim2=-1)[..., None]
    y = torch.where(visible, log_a - diagonal, 0.0)
    x = torch.where(visible, -distance, 0.0).expand_as(y)
    slopes = (x * y).sum(dim=(0, 2, 3)) / (x * x).sum(dim=(0, 2, 3)).clamp_min(1e-300)
    residual = torch.where(visible, y - slopes[None, :, None, None] * x, 0.0)
    return slopes, float(residual.abs().max()), float(y.abs().max())


def _slopes_text(slopes: list[float]) -> str:
    return "[" + ", ".join(fmt(m) for m in slopes) + "]"


class Alibi(Check):
    """Position bias -m_h d(i, j) with m_h > 0 per head (the paper's slopes where declared)."""

    name = "alibi"
    order = 200
    applies = "an ALiBi position bias"
    title = "ALiBi: a per-head linear distance penalty -m_h (i - j), m_h > 0 (declared slopes)"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.position.alibi is None:
            return Lacking("no ALiBi position bias")
        if not capabilities.weights:
            return "needs canonical weight access to zero the content logits"
        if not wide_dtypes(capabilities):
            return "measured in float32 or float64, and it declares neither"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        strategy = cases(caps, context.device, probe=True, min_len=3,
                         dtypes=(torch.float32, torch.float64), cross=False)
        context.explore(strategy, lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> str | None:
        attention = measure_attention(context.build(case), case, context.capabilities.call,
                                      causal=case.causal, gain=0.0)
        length = case.q_len
        rows = torch.arange(length)[:, None]
        cols = torch.arange(length)[None, :]
        distance = ((rows - cols) if case.causal else (rows - cols).abs()).to(torch.float64)
        visible = allowed_keys(case.batch, length, length, None, case.causal,
                               window=case.window, chunk=case.chunk)
        if bool(torch.isnan(attention).any()) or not bool((attention[visible.expand_as(
                attention)] > 0).all()):
            raise Violation("with zero content logits some visible key gets weight 0 or NaN: "
                            "the position bias is not a finite additive term")
        slopes, residual, size = fit_slopes(attention, visible, distance)
        tolerance = RESIDUAL_ULPS * eps(context.judged(case.config.dtype)) * (1.0 + size)
        measured = [float(m) for m in slopes]
        kind = "i - j" if case.causal else "|i - j|"
        if residual > tolerance:
            raise Violation(
                f"the position bias is not -m_h ({kind}) for one slope per head: log-weight "
                f"residual {fmt(residual)} (allowed {fmt(tolerance)})",
                details=[f"best-fitting slopes {_slopes_text(measured)}"],
                hint="is the bias built from absolute positions, or is its distance clipped?")
        for h, m in enumerate(measured):
            if m <= tolerance:
                raise Violation(
                    f"head {h}'s position bias is {fmt(-m)} x ({kind}): it "
                    + ("grows with the distance" if m < 0 else "is flat") + ", where ALiBi "
                    "penalises distant keys (a slope m > 0)",
                    details=[f"fitted slopes {_slopes_text(measured)}"],
                    hint="is the ALiBi bias added with the wrong sign (+m (i - j))?"
                    if m < 0 else None)
        if context.capabilities.position.alibi != "standard":
            if any(note.startswith("ALiBi slopes") for note in context.observations):
                return None
            return f"ALiBi slopes measured with {case.num_heads} heads: {_slopes_text(measured)}"
        encoding = context.capabilities.position.encoding
        expected = (standard_slopes(case.num_heads) if encoding is None or encoding.alibi is None
                    else head_slopes(encoding.alibi, case.num_heads, case.config.kv_heads))
        if encoding is not None and encoding.alibi is not None and encoding.alibi.scaled:
            # Added before the logits' scaling (reproduced, and warned about by reference).
            expected = [m / math.sqrt(case.head_dim) for m in expected]
        worst = max(range(case.num_heads), key=lambda h: abs(measured[h] - expected[h]))
        if abs(measured[worst] - expected[worst]) <= tolerance * max(1.0, expected[worst]):
            return None
        hint = None
        if all(abs(m - e) <= tolerance for m, e in zip(measured, expected[::-1], strict=True)):
            hint = "the standard slopes in reverse head order: are they assigned to the heads " \
                   "back to front?"
        raise Violation(
            f"head {worst}'s slope is {fmt(measured[worst])}, the standard ALiBi slope for "
            f"{case.num_heads} heads is {fmt(expected[worst])}",
            details=[f"fitted slopes {_slopes_text(measured)}", f"standard slopes "
                     f"{_slopes_text(expected)}"], hint=hint)
