"""Which map turns a layer's logits into its attention weights, fitted from measured weights.

Given the weights A (B, H, Lq, Lk) a layer computed and the products s = q·kᵀ behind them (both
float64, from the attention-matrix probe), and the keys each row may see: a softmax over the
keys (rows sum to 1, every visible key weighted), a softmax over a subset of them the data
chooses, an elementwise sigmoid of a s + b, or a stick-breaking product of such sigmoids. The
fit is exact arithmetic's: a float64 probe leaves residuals of ~1e-12, a wrong map ~1e-1.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from conformance.model.normaliser import (
    FEATURE_POWERS,
    FEATURES,
    Normaliser,
    NormaliserKind,
    feature_products,
    over_row_sums,
)

SUMS_TO_ONE = 1e-6
"""How far a float64 row's sum may be from 1 for a softmax (its rounding is ~1e-15)."""
FIT_RESIDUAL = 1e-5
"""The largest residual of logit(weight) = a s + b over the fitted entries for a map to be
observed (float64 weights in (1e-9, 1 - 1e-9): the logit's rounding is under 1e-6)."""
INSIDE = 1e-9
"""Weights this close to 0 or 1 say nothing about the logit behind them (saturated)."""
FEATURE_RESIDUAL = 1e-9
"""The largest difference between measured weights (each at most 1) and a linear-attention
fit's for the fit to be observed: float64 rounding leaves ~1e-15, a softmax ~1e-1."""


def _row_sums(attention: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    return torch.where(rows, attention.sum(-1), torch.ones_like(attention[..., 0]))


def _linear_fit(logit: torch.Tensor, scores: torch.Tensor) -> tuple[float, float, float] | None:
    """(a, b, the largest residual) of logit = a scores + b by least squares; None with fewer
    than three entries or scores that do not vary."""
    if logit.numel() < 3 or float(scores.std()) == 0.0:
        return None
    design = torch.stack([scores, torch.ones_like(scores)], dim=-1)
    solution = torch.linalg.lstsq(design, logit[:, None]).solution[:, 0]
    residual = float((design @ solution - logit).abs().max())
    return float(solution[0]), float(solution[1]), residual


def _logit(p: torch.Tensor) -> torch.Tensor:
    return torch.log(p) - torch.log1p(-p)


def _logit_fit(p: torch.Tensor, scores: torch.Tensor, inside: torch.Tensor
               ) -> tuple[float, float] | None:
    """(a, b) of logit(p) = a scores + b over the ``inside`` entries, where the residual is
    rounding's alone."""
    fitted = _linear_fit(_logit(p[inside]), scores[inside])
    return None if fitted is None or fitted[2] > FIT_RESIDUAL else (fitted[0], fitted[1])


def _sigmoid_fit(attention, scores, visible) -> tuple[float, float] | None:
    inside = visible & (attention > INSIDE) & (attention < 1 - INSIDE)
    return _logit_fit(attention, scores, inside)


def _stick_fit(attention, scores, visible) -> tuple[float, float] | None:
    # What the nearer keys left of the stick: 1 - sum_{k > j} A_ik (prod (1 - beta_ik) over them)
    later = attention.flip(-1).cumsum(-1).flip(-1) - attention
    rest = 1 - later
    beta = attention / rest.clamp_min(INSIDE)
    inside = visible & (rest > 1e-6) & (beta > INSIDE) & (beta < 1 - INSIDE)
    return _logit_fit(beta, scores, inside)


def _rectified_fit(attention, scores, visible) -> tuple[float, float] | None:
    """(a, b) of weights max(0, a s + b): linear where positive (a > 0), and a s + b <= 0 where
    a visible weight is exactly 0; None otherwise (or with no zero to show the kink)."""
    positive = visible & (attention > 0)
    zero = visible & (attention == 0)
    if not bool(zero.any()):
        return None
    fitted = _linear_fit(attention[positive], scores[positive])
    if fitted is None or fitted[0] <= 0:
        return None
    a, b, residual = fitted
    size = float(attention[positive].abs().max())
    if residual > FIT_RESIDUAL * max(size, 1.0):
        return None
    below = a * scores[zero] + b
    return (a, b) if float(below.max()) <= FIT_RESIDUAL * max(size, 1.0) else None


def _feature_fit(attention: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 visible: torch.Tensor) -> Normaliser | None:
    """Linear attention where a feature map of q and k reproduces the weights: A =
    phi(q)·phi(k) / (row sum + eps), eps fitted from the rows' sums (a number added to the
    denominator, 0 where there is none)."""
    rows = visible.any(-1)
    measured_sums = attention.sum(-1)
    for feature in FEATURES:
        for powers in FEATURE_POWERS:
            products = feature_products(q, k, visible, feature, powers)
            sums = products.sum(-1)
            fit = rows & (sums > 0) & (measured_sums > 0)
            if not bool(fit.any()):
                continue
            epsilon = float((sums[fit] * (1 / measured_sums[fit] - 1)).median())
            epsilon = 0.0 if abs(epsilon) < 1e-13 else epsilon
            if epsilon < 0:
                continue
            predicted = over_row_sums(products, epsilon)
            if float((predicted - attention)[rows].abs().max()) <= FEATURE_RESIDUAL:
                return Normaliser(NormaliserKind.LINEAR, feature=feature, feature_powers=powers,
                                  epsilon=epsilon,
                                  evidence=f"phi = {feature} reproduces every weight within "
                                           f"{FEATURE_RESIDUAL:g}")
    return None


def fit_normaliser(attention: torch.Tensor, scores: torch.Tensor, visible: torch.Tensor,
                   q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                   ) -> Normaliser | None:
    """The map from ``scores`` (B, H, Lq, Lk, unscaled q·k) to ``attention`` over the
    ``visible`` keys (broadcast to the same shape, bool), or None where it is a softmax over the
    keys (every visible key weighted, as a structure fixed over inputs may leave some at 0).
    With the ``q`` and ``k`` behind the scores, linear attention (a feature map of each, rows
    summing to 1) is told from a softmax. Unfit rows (no visible key) are ignored."""
    attention, scores = attention.to(torch.float64), scores.to(torch.float64)
    visible = visible.expand(attention.shape)
    if attention.shape[-2] > 1 and float((attention.sum(-2) - 1).abs().max()) <= SUMS_TO_ONE:
        return None  # a softmax over the queries: a mistake row_stochastic names, no design
    rows = visible.any(-1)
    sums = _row_sums(attention, rows)
    off = (sums - 1).abs()
    b, h, row = (int(i) for i in torch.nonzero(off == off.max())[0])
    evidence = f"row {row} sums to {float(sums[b, h, row]):.3g}"
    if float(off.max()) <= SUMS_TO_ONE:
        zeros = visible & (attention == 0)
        if q is not None and k is not None and (
                found := _feature_fit(attention, q.to(torch.float64), k.to(torch.float64),
                                      visible)) is not None:
            return found
        if not bool(zeros.any()) or bool((zeros == zeros[:1]).all()):
            return None  # every visible key weighted, or the same ones left out for every input
        held = int(zeros.any(-1).sum())
        return Normaliser(NormaliserKind.SELECTED,
                          evidence=f"{held} row(s) weigh visible keys 0, and which differ "
                                   "between inputs")
    if bool((attention.masked_fill(visible, 0.0) != 0).any()):
        # A weight where no key is visible: no elementwise map of q·k gives it.
        return Normaliser(NormaliserKind.UNKNOWN, evidence=evidence)
    if (fit := _sigmoid_fit(attention, scores, visible)) is not None:
        return Normaliser(NormaliserKind.SIGMOID, scale=fit[0], bias=fit[1], evidence=evidence)
    if (fit := _rectified_fit(attention, scores, visible)) is not None:
        return Normaliser(NormaliserKind.RECTIFIED, scale=fit[0], bias=fit[1],
                          evidence=evidence)
    # Stick-breaking may leave a row's own token out (weight exactly 0 on every row's own,
    # where a sigmoid is never 0): then it is fitted over the keys before it.
    seen, current = visible, True
    if attention.shape[-1] == attention.shape[-2]:
        own = torch.eye(attention.shape[-1], dtype=torch.bool).expand(attention.shape) & visible
        if bool(own.any()) and bool((attention[own] == 0).all()):
            seen, current = visible & ~own, False
    if (fit := _stick_fit(attention, scores, seen)) is not None:
        return Normaliser(NormaliserKind.STICK_BREAKING, scale=fit[0], bias=fit[1],
                          attends_current=current, evidence=evidence)
    if q is not None and k is not None and (  # a larger eps: rows sum to 1 less than it
            found := _feature_fit(attention, q.to(torch.float64), k.to(torch.float64),
                                  visible)) is not None:
        return found
    return Normaliser(NormaliserKind.UNKNOWN, evidence=evidence)


def _snap(value: float, choices: tuple[float, ...], within: float) -> float:
    near = min(choices, key=lambda choice: abs(choice - value))
    return near if abs(near - value) <= within else value


def laws(at_lengths: tuple[Normaliser, Normaliser], lengths: tuple[int, int],
         at_width: Normaliser | None, widths: tuple[int, int]) -> Normaliser | None:
    """One normaliser for fits at two key counts n1, n2 (width w1) and, where the layer builds
    there, at n1 and a second width w2: its slope a = factor w ** power (power measured between
    w1 and w2; 1/sqrt(w) assumed without w2), its bias constant or ``c - log n`` (Ramapuram's).
    None where the fits disagree (different maps, or a slope that moves with the length)."""
    first, second = at_lengths
    if first.kind is not second.kind or (at_width is not None and at_width.kind is not first.kind):
        return None
    if not first.modelled:
        return first
    if first.kind is NormaliserKind.LINEAR:
        same = (at_width is None or at_width.feature_powers == first.feature_powers) and (
            second.feature, second.feature_powers) == (first.feature, first.feature_powers)
        close = abs(first.epsilon - second.epsilon) <= 1e-3 * max(first.epsilon, 1e-12)
        return first if same and (close or first.epsilon == second.epsilon) else None
    if first.kind is NormaliserKind.RECTIFIED:
        return _rectified_laws(first, second, lengths, at_width, widths)
    a1, a2 = first.scale, second.scale
    if a1 is None or a2 is None or abs(a1 - a2) > 1e-4 * max(abs(a1), 1e-12) or a1 <= 0:
        return None
    power = -0.5
    if at_width is not None and at_width.scale is not None and at_width.scale > 0:
        power = _snap(math.log(a1 / at_width.scale) / math.log(widths[0] / widths[1]),
                      (-0.5, -1.0, 0.0), 0.02)
    factor = _snap(a1 / widths[0] ** power, (1.0,), 1e-4)
    found = replace(first, scale=factor, power=power,
                    bias=_snap(first.bias, (0.0,), 1e-6))
    if abs(first.bias - second.bias) <= 1e-4:
        return found
    drop = (first.bias - second.bias) / (math.log(lengths[0]) - math.log(lengths[1]))
    if abs(drop + 1) <= 1e-4:
        return replace(found, bias=_snap(first.bias + math.log(lengths[0]), (0.0,), 1e-6),
                       log_length=-1.0)
    return None


def _rectified_laws(first: Normaliser, second: Normaliser, lengths: tuple[int, int],
                    at_width: Normaliser | None, widths: tuple[int, int]) -> Normaliser | None:
    """A rectified map's weights scale as n ** lambda with the key count n (-1: divided by n):
    lambda from the slopes at the two lengths, then the slope's width law as :func:`laws`'."""
    a1, a2 = first.scale, second.scale
    if a1 is None or a2 is None or a1 <= 0 or a2 <= 0:
        return None
    power_n = _snap(math.log(a1 / a2) / math.log(lengths[0] / lengths[1]), (0.0, -1.0, -0.5),
                    0.02)
    slope, bias = a1 / lengths[0] ** power_n, first.bias / lengths[0] ** power_n
    if abs(second.bias / lengths[1] ** power_n - bias) > 1e-4 * max(abs(bias), 1.0):
        return None
    power = -0.5
    if at_width is not None and at_width.scale is not None and at_width.scale > 0:
        power = _snap(math.log(a1 / at_width.scale) / math.log(widths[0] / widths[1]),
                      (-0.5, -1.0, 0.0), 0.02)
    return replace(first, scale=_snap(slope / widths[0] ** power, (1.0,), 1e-4), power=power,
                   bias=_snap(bias, (0.0,), 1e-6), length_power=power_n)
