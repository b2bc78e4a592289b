"""The reference through the core: where no weight layout maps a layer (or its position encoding
is one the reference does not model), each attention core its forward computes is compared with
the float64 softmax of that core's own logits, with the keys attention hides masked.

Property: at every core, the weights its softmax gives (SDPA: the weights its scores, its scale
and its mask's bias give) equal, within the rounding of the core's dtype, the float64 softmax
over the keys of the same logits with every key the case's padding, causality, window and chunk
hide masked; where the softmax's weights are what multiply the values (one map, no sinks), so do
those. Only the rows attention specifies are judged. What the logits are made of (the scale, a
learned bias, RoPE) is the other checks'; a key the layer hides that attention would show is
``causal``'s, ``chunked``'s and ``padding``'s: here the layer's own mask is kept.
"""

from __future__ import annotations

import torch

from conformance.checks.core_route import core_words, sites_of
from conformance.checks.diagnosis import SOFTMAX_OVER_QUERIES
from conformance.checks.invariants.base import CheckContext
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Violation
from conformance.checks.mask_mistakes import Mistake, named
from conformance.generation.cases import Case
from conformance.model.core import AttentionSite, CoreKind
from conformance.numerics.reference import allowed_keys
from conformance.numerics.tolerance import worst_index

ROUNDING_ULPS = 4
"""Units in the last place of the core's dtype, per key and per unit of logit spread: a softmax's
weight is rounded with its exponent's argument (x - max, rounded relative to its size) and its sum
over the keys."""

MASKED_AFTER = named(Mistake.AFTER_SOFTMAX)
"""The mask mistake the weights that multiply the values show where they are the softmax's
times the mask, not renormalised: named as the weights route names it, with its kind."""
LEAKS = "a key the mask (or the causal structure) hides gets weight: is the mask applied there?"


def _softmax(logits: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """float64 softmax over the last axis with ``hidden`` entries at -inf (NaN rows kept)."""
    return torch.softmax(logits.to(torch.float64).masked_fill(hidden, float("-inf")), dim=-1)


def _hidden(case: Case, columns: int) -> torch.Tensor:
    """(Lq, columns) bool: the keys attention hides from each row (batch element 0's mask, which
    every element shares in a core case), and none of the columns beyond the keys (sinks)."""
    keep = case.keep()
    allowed = allowed_keys(1, case.q_len, case.kv_len, None if keep is None else keep[:1].cpu(),
                           case.causal, window=case.window, chunk=case.chunk)[0, 0]
    hidden = torch.zeros(case.q_len, columns, dtype=torch.bool)
    hidden[:, : case.kv_len] = ~allowed
    return hidden


def _weights(site: AttentionSite, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the core's own weights, the reference's), float64, (G, Lq, columns)."""
    if site.kind is CoreKind.SDPA:
        logits = site.scale * site.scores + site.bias
        own = _softmax(logits, ~site.allowed)
        return own, _softmax(logits, ~site.allowed | hidden)
    return site.probabilities.to(torch.float64), _softmax(site.logits, hidden)


def _tolerance(site: AttentionSite, reference: torch.Tensor) -> float:
    """The rounding a core's weights may carry (see ROUNDING_ULPS)."""
    dtype = site.probabilities.dtype if site.probabilities is not None else site.scores.dtype
    if site.logits is not None:
        logits = site.logits.to(torch.float64)
        finite = logits[torch.isfinite(logits) & (reference > 0)]
        spread = float(finite.max() - finite.min()) if finite.numel() else 0.0
    else:
        spread = 0.0
    return ROUNDING_ULPS * torch.finfo(dtype).eps * (reference.shape[-1] + 2 + spread)


def _after(site: AttentionSite, own: torch.Tensor, hidden: torch.Tensor, judged: torch.Tensor,
           tolerance: float) -> bool:
    """Whether the weights that multiply the values are the softmax's ``own`` times the mask,
    not renormalised, on the ``judged`` rows (measured only for a failure's hint)."""
    return site.used is not None and site.used.shape == own.shape and bool(torch.allclose(
        torch.where(judged, site.used.to(torch.float64), 0.0),
        torch.where(judged, own * ~hidden, 0.0), atol=tolerance))


def verify_core(context: CheckContext, case: Case) -> None:
    """The property of the module docstring on ``case`` (one mask for the batch)."""
    found = sites_of(context.build(case), case.inputs(context.capabilities.call), case)
    rows = context.rows(case)[0]
    for index, site in enumerate(found):
        where = core_words(site, index, len(found))
        if site.kind is CoreKind.SOFTMAX and (site.logits is None or site.probabilities is None):
            continue
        columns = site.scores.shape[-1] if site.kind is CoreKind.SDPA else site.logits.shape[-1]
        hidden = _hidden(case, columns)
        own, expected = _weights(site, hidden)
        judged = rows[None, :, None] & torch.isfinite(expected)  # a row hidden whole: not here
        diff = torch.where(judged, (own - expected).abs(), 0.0).nan_to_num(nan=float("inf"))
        tolerance = _tolerance(site, expected)
        if float(diff.max()) > tolerance:
            group, row, key = worst_index(diff)
            leaked = torch.where(hidden[row], own[group, row], 0.0).nan_to_num()
            if float(leaked.sum()) > tolerance:
                keys = [int(k) for k in torch.nonzero(leaked > tolerance).flatten()]
                after = _after(site, own, hidden, judged, tolerance)
                raise Violation(
                    f"{where}: group {group}, row {row} gives the keys attention hides from it "
                    f"({', '.join(map(str, keys))}) weight {fmt(float(leaked.sum()))} in all, "
                    "where the float64 softmax of its own logits with them masked gives them 0 "
                    f"(tolerance {fmt(tolerance)})", hint=MASKED_AFTER if after else LEAKS)
            raise Violation(
                f"{where}: group {group}, row {row} gives key {key} weight "
                f"{fmt(float(own[group, row, key]))}, where the float64 softmax of its own "
                f"logits gives {fmt(float(expected[group, row, key]))} (tolerance "
                f"{fmt(tolerance)})",
                hint=SOFTMAX_OVER_QUERIES if site.over_keys is False else None)
        if site.kind is CoreKind.SDPA or site.used is None or site.combined > 1 or site.sinks \
                or site.used.shape != expected.shape:
            continue
        used = site.used.to(torch.float64)
        diff = torch.where(judged, (used - expected).abs(), 0.0).nan_to_num(nan=float("inf"))
        if float(diff.max()) > tolerance:
            group, row, key = worst_index(diff)
            raise Violation(
                f"{where}: the weights that multiply the values give row {row} (group {group}) "
                f"key {key} weight {fmt(float(used[group, row, key]))}, where the float64 softmax "
                f"of its logits with the keys attention hides masked gives "
                f"{fmt(float(expected[group, row, key]))} (tolerance {fmt(tolerance)})",
                hint=MASKED_AFTER if _after(site, own, hidden, judged, tolerance) else None)
