"""What two forwards of one layer show at its attention core (:mod:`conformance.model.core`): the
scale of q·kᵀ in its logits, and the bias the tokens don't move (a mask, a position bias).

Two forwards over other tokens and the same mask: the logits' change is the scale times the
change of q·kᵀ (Δlogits = s·Δ(q·kᵀ)), whatever bias the layer adds that the tokens don't move;
the bias is then logits − s·q·kᵀ, and how it varies over (query i, key j) says whether the layer
depends on positions: not at all (a constant per row, which the softmax ignores), by j − i alone
(relative, T5's buckets, ALiBi) or otherwise (absolute).
"""

from __future__ import annotations

from enum import Enum

import torch

from conformance.model.core import AttentionSite, CoreKind

LOGIT_RESIDUAL = 0.05
"""Largest change in logits between two inputs that a single scale of q·kᵀ may leave
unexplained, relative to the change's own spread (see :func:`fitted_scale`): a bias the tokens
don't move cancels; a softcap's tanh at the usual caps (30, 50) bends the logits by well under
1 %; a transform that leaves more is not one scale, and no scale or bias is measured there."""

BIAS_ULPS = 16
"""Units in the last place of the logits' dtype (times their size) a bias may vary by and be
no position dependence: the rounding of logits and of their fitted part."""


class BiasForm(str, Enum):
    """How a core's logit bias depends on the positions of query i and key j."""

    NONE = "none"
    RELATIVE = "relative"
    """A function of j − i alone."""
    ABSOLUTE = "absolute"
    """Another function of (i, j)."""


def uncapped(site: AttentionSite) -> torch.Tensor:
    """The logits before a softcap c (c·atanh(logits / c), float64; NaN where a logit is at the
    cap, or masked past it), or the logits where none."""
    logits = site.logits.to(torch.float64)
    if site.softcap is None:
        return logits
    ratio = logits / site.softcap
    return torch.where(ratio.abs() < 1, site.softcap * torch.atanh(ratio.clamp(-1, 1)),
                       float("nan"))


def _usable(first: AttentionSite, second: AttentionSite) -> torch.Tensor:
    """Where both forwards give a key weight (masked keys excluded) and everything is finite."""
    return ((first.probabilities > 0) & (second.probabilities > 0)
            & torch.isfinite(uncapped(first)) & torch.isfinite(uncapped(second))
            & torch.isfinite(first.scores) & torch.isfinite(second.scores))


def fitted_scale(first: AttentionSite, second: AttentionSite) -> tuple[float, float]:
    """The scale s with logits = s·q·kᵀ + b (before a softcap), fitted by least squares over the
    keys both forwards weigh; and the largest residual relative to the changes' spread (a
    transform that bends the logits leaves one). (nan, 0) where nothing changed. An SDPA core
    states its scale."""
    if first.kind is CoreKind.SDPA:
        return float(first.scale), 0.0
    usable = _usable(first, second)
    d_logits = (uncapped(first) - uncapped(second))[usable]
    d_scores = (first.scores - second.scores)[usable]
    denominator = float((d_scores * d_scores).sum())
    if denominator == 0.0 or d_logits.numel() < 2:
        return float("nan"), 0.0
    s = float((d_scores * d_logits).sum()) / denominator
    spread = float(d_logits.pow(2).mean().sqrt())
    residual = float((d_logits - s * d_scores).abs().max()) / spread if spread else 0.0
    return s, residual


def logit_bias(first: AttentionSite, second: AttentionSite, scale: float) -> torch.Tensor:
    """(G, Lq, Lk) float64: logits − scale·q·kᵀ of the first forward, NaN where a key is not
    weighed (masked) or anything is not finite; an SDPA core's float mask."""
    if first.kind is CoreKind.SDPA:
        return torch.where(first.allowed, first.bias, float("nan"))
    bias = uncapped(first) - scale * first.scores
    return torch.where(_usable(first, second), bias, float("nan"))


def bias_tolerance(site: AttentionSite) -> float:
    """How much a bias measured at ``site`` may vary from rounding alone (over the logits of
    keys it weighs: a mask's fill is no size)."""
    if site.logits is None:
        return 0.0
    finite = site.logits[torch.isfinite(site.logits) & (site.probabilities > 0)].to(torch.float64)
    size = float(finite.abs().max()) if finite.numel() else 0.0
    return BIAS_ULPS * torch.finfo(site.logits.dtype).eps * (size + 1.0)


def bias_form(bias: torch.Tensor, tolerance: float) -> BiasForm:
    """How ``bias`` (G, Lq, Lk, NaN where not weighed) depends on positions, beyond
    ``tolerance``: a bias constant along each row is none (the softmax ignores it)."""
    centred = bias - torch.nanmean(bias, dim=-1, keepdim=True)
    if not bool((centred.abs() > tolerance).any()):
        return BiasForm.NONE
    # Relative: every diagonal (j − i constant) holds one value within each group.
    for offset in range(-bias.shape[-2] + 1, bias.shape[-1]):
        diagonal = torch.diagonal(bias, offset=offset, dim1=-2, dim2=-1)
        spread_here = torch.nan_to_num(diagonal - torch.nanmean(diagonal, dim=-1, keepdim=True))
        if bool((spread_here.abs() > tolerance).any()):
            return BiasForm.ABSOLUTE
    return BiasForm.RELATIVE
