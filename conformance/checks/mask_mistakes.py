"""Recognise mask mistakes by behaviour: an output, or a measured attention matrix, that is
attention under a known wrong mask.

Each mistake is a mask that differs from the one attention specifies: the key-padding mask read
inverted, the padding mask applied after the softmax (masked weights zeroed, the rest not
renormalised), the causal diagonal off by one either way, no causal mask at all, a causal mask
where none is declared. A mistake is named only when the module's
behaviour reproduces it: its output matches the float64 reference computed with that mask (or
its measured weights are a distribution over exactly the keys that mask allows), on the rows
where the mistaken mask leaves a key to attend to, and on at least one row where the mistake
and the correct mask differ. Otherwise nothing is named: a symptom shared by many bugs is not
evidence for one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from conformance.model.forms import PositionEncoding
from conformance.model.results import Hint
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import allowed_keys, attention_output, reference_attention
from conformance.numerics.tolerance import abs_error, only_rows
from conformance.subject.boundary import Inputs

MATCH = 1e-3
"""Relative closeness that counts as "reproduces this mistake" (as in :mod:`conformance.checks.diagnosis`):
the mistake is computed in float64, the module is not."""

class Mistake(Enum):
    """A recognisable mask mistake; its value is what it is, in words, for a reader."""

    INVERTED = "the mask is read inverted: kept keys are masked and masked ones kept"
    AFTER_SOFTMAX = ("masked weights are zeroed after the softmax: kept weights no longer sum "
                     "to 1 (mask the logits before the softmax)")
    HIDES_CURRENT = ("the causal mask hides the current token: row t sees only positions "
                     "before t, and the first row sees nothing (triu(diagonal=0) where "
                     "diagonal=1 is meant)")
    SHOWS_NEXT = ("the causal mask lets each row see the next position too (triu diagonal off "
                  "by one: diagonal=2 where diagonal=1 is meant)")
    IGNORES_CAUSAL = "the causal mask is not applied: rows see later positions"
    TRANSPOSED = ("the causal mask is transposed: each row sees itself and the later positions, "
                  "not the earlier ones (an upper triangle, triu, where the lower one, tril, "
                  "belongs)")
    REPLACES_CAUSAL = ("a given padding mask replaces the causal mask instead of being combined "
                       "with it: with a padding mask, rows see later positions")
    CAUSAL_UNDECLARED = ("a causal mask is applied, though the module is not meant to be "
                         "causal: each row sees only itself and earlier positions")

    @property
    def words(self) -> str:
        return self.value


def kind_of(mistake: Mistake) -> str:
    """The kind of bug ``mistake`` is (:class:`conformance.model.results.Hint`'s ``kind``)."""
    return f"mask: {mistake.name.lower()}"


def named(mistake: Mistake | None) -> str | None:
    """``mistake`` in words, for a hint, with its kind (None for none)."""
    return None if mistake is None else Hint(mistake.words, kind_of(mistake))


@dataclass(frozen=True)
class MaskMistake:
    """A wrong mask: ``kind``, which mistake; ``allowed`` (B, 1, Lq, Lk) bool, the keys each
    row's softmax runs over; ``zeroed_after`` (B, Lk) bool, the keys whose weights survive after
    the softmax (None: all)."""

    kind: Mistake
    allowed: torch.Tensor
    zeroed_after: torch.Tensor | None = None

    def visible(self) -> torch.Tensor:
        """(B, 1, Lq, Lk) bool: the keys that end with weight (allowed, and kept after)."""
        if self.zeroed_after is None:
            return self.allowed
        return self.allowed & self.zeroed_after.cpu()[:, None, None, :]


def mask_mistakes(batch: int, q_len: int, kv_len: int, keep: torch.Tensor | None, *,
                  causal: bool, window: int | None = None, chunk: int | None = None) -> list[MaskMistake]:
    """The known mask mistakes that differ from the mask attention specifies for these shapes
    (``keep`` (B, Lk) bool, top-left causal, a window of W keys, chunks of C positions)."""
    keep = None if keep is None else keep.cpu()
    mistakes: list[MaskMistake] = []
    rows = torch.arange(q_len)[:, None]
    cols = torch.arange(kv_len)[None, :]
    if keep is not None:
        mistakes.append(MaskMistake(Mistake.INVERTED, allowed_keys(
            batch, q_len, kv_len, ~keep, causal, window=window, chunk=chunk)))
        mistakes.append(MaskMistake(Mistake.AFTER_SOFTMAX, allowed_keys(
            batch, q_len, kv_len, None, causal, window=window, chunk=chunk), zeroed_after=keep))
    if causal:
        true = allowed_keys(batch, q_len, kv_len, keep, True, window=window, chunk=chunk)
        mistakes.append(MaskMistake(Mistake.HIDES_CURRENT, true & (cols < rows)))
        ahead = allowed_keys(batch, q_len, kv_len, keep, False) & (cols <= rows + 1)
        if window is not None:
            ahead = ahead & (rows - cols < window)
        if chunk is not None:
            ahead = ahead & (rows // chunk == cols // chunk)
        mistakes.append(MaskMistake(Mistake.SHOWS_NEXT, ahead))
        mistakes.append(MaskMistake(Mistake.IGNORES_CAUSAL, allowed_keys(
            batch, q_len, kv_len, keep, False)))
        mistakes.append(MaskMistake(Mistake.TRANSPOSED, allowed_keys(
            batch, q_len, kv_len, keep, False) & (cols >= rows)))
    elif q_len == kv_len and q_len > 1:
        mistakes.append(MaskMistake(Mistake.CAUSAL_UNDECLARED,
                                    allowed_keys(batch, q_len, kv_len, keep, True)))
    return mistakes


def _evidence_rows(mistake: MaskMistake, correct: torch.Tensor,
                   rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, Lq) bool twice: the rows a mistake can be compared on (the mistaken mask leaves them
    a key, and the caller counts them), and among those the rows where it differs from
    ``correct`` (B, 1, Lq, Lk)."""
    visible = mistake.visible()
    compared = visible.any(dim=-1)[:, 0]
    if rows is not None:
        compared = compared & rows.cpu()
    differs = (visible != correct).any(dim=-1)[:, 0]
    if mistake.zeroed_after is not None:
        differs = differs | (mistake.allowed != correct).any(dim=-1)[:, 0]
    return compared, compared & differs


def _largest(values: torch.Tensor) -> float:
    """The largest of ``values``, 0 for none."""
    return float(values.max()) if values.numel() else 0.0


def _close(actual: torch.Tensor, expected: torch.Tensor, rows: torch.Tensor) -> bool:
    scale = max(1.0, float(only_rows(expected.abs(), rows).max()))
    return float(only_rows(abs_error(actual, expected), rows).max()) <= MATCH * scale


def output_mistake(output: torch.Tensor, weights: HeadWeights, inputs: Inputs, *, causal: bool,
                   rows: torch.Tensor | None = None, window: int | None = None, chunk: int | None = None,
                   encoding: PositionEncoding | None = None,
                   only: tuple[Mistake, ...] | None = None) -> Mistake | None:
    """The mask mistake ``output`` (B, Lq, D) reproduces, or None (none does, or
    several do: then this example can't tell which).

    Reproduces: on the rows in ``rows`` (default all) where the mistaken mask leaves a key,
    ``output`` matches the float64 reference computed from ``weights`` with that mask, and on
    one of them at least the mistake's reference differs from the correct one. ``only``
    restricts the mistakes tried to those.
    """
    found: list[Mistake] = []
    batch, q_len, kv_len = inputs.query.shape[0], inputs.query.shape[1], inputs.key.shape[1]
    keep = None if inputs.keep is None else inputs.keep.cpu()
    correct_mask = allowed_keys(batch, q_len, kv_len, keep, causal, window=window, chunk=chunk)
    correct = None
    for mistake in mask_mistakes(batch, q_len, kv_len, keep, causal=causal, window=window, chunk=chunk):
        if only is not None and mistake.kind not in only:
            continue
        compared, differs = _evidence_rows(mistake, correct_mask, rows)
        if not bool(differs.any()):
            continue

        def reference(allowed=None, zeroed_after=None) -> torch.Tensor:
            result = reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                         keep=keep, causal=causal, window=window, chunk=chunk,
                                         encoding=encoding, start=inputs.position,
                                         allowed=allowed)
            if zeroed_after is None:
                return result.output
            # A mask applied after the softmax: the weights of the masked keys dropped, the
            # rest not renormalised.
            kept = result.attention * zeroed_after.to(result.attention)[:, None, None, :]
            return attention_output(kept, result.values, weights)

        expected = reference(mistake.allowed, mistake.zeroed_after)
        if not _close(output, expected, compared):
            continue
        correct = reference() if correct is None else correct
        if _close(correct, expected, differs):
            continue  # on these rows the mistake gives the correct output: no evidence
        found.append(mistake.kind)
    return found[0] if len(found) == 1 else None


def weights_mistake(attention: torch.Tensor, keep: torch.Tensor | None, *, causal: bool,
                    tolerance: float, rows: torch.Tensor | None = None,
                    window: int | None = None, chunk: int | None = None, logits: torch.Tensor | None = None,
                    only: tuple[Mistake, ...] | None = None) -> Mistake | None:
    """The mask mistake a measured attention matrix ``attention`` (B, H, Lq, Lk) shows, or None
    (none does, or several do).

    Shows: on the rows in ``rows`` (default all) where the mistaken mask leaves a key, every
    head's row is finite, gives positive weight to exactly the keys that mask leaves and 0
    (within ``tolerance``) to the others, and sums to 1 (for a mask applied after the
    softmax: to less than 1 wherever a masked key was dropped); and on one of those rows at
    least the mistake differs from the correct mask. With the ``logits`` the weights were
    measured at (B, H, Lq, Lk, scaled, any position bias added), the weights must also be
    those the mistake gives, within ``tolerance``.
    """
    batch, _, q_len, kv_len = attention.shape
    keep = None if keep is None else keep.cpu()
    correct = allowed_keys(batch, q_len, kv_len, keep, causal, window=window, chunk=chunk)
    attention = attention.detach().to(torch.float64).cpu()
    found: list[Mistake] = []
    for mistake in mask_mistakes(batch, q_len, kv_len, keep, causal=causal, window=window, chunk=chunk):
        if only is not None and mistake.kind not in only:
            continue
        compared, differs = _evidence_rows(mistake, correct, rows)
        if not bool(differs.any()):
            continue
        selected = compared[:, None, :].expand(attention.shape[:3])
        chosen = attention[selected]
        seen = mistake.visible().expand_as(attention)[selected]
        if not bool(torch.isfinite(chosen).all()):
            continue
        if _largest(chosen[~seen].abs()) > tolerance:
            continue
        if not bool((chosen[seen] > 0).all()):
            continue
        sums = chosen.sum(dim=-1)
        dropped = differs[:, None, :].expand(attention.shape[:3])[selected]
        if mistake.zeroed_after is None:
            dropped = torch.zeros_like(dropped)
        if _largest((sums[~dropped] - 1).abs()) > tolerance * kv_len:
            continue
        if not bool((sums[dropped] < 1 - tolerance * kv_len).all()):
            continue
        if logits is not None:
            scores = logits.detach().to(torch.float64).cpu().masked_fill(~mistake.allowed,
                                                                           float("-inf"))
            expected = torch.softmax(scores, dim=-1)
            if mistake.zeroed_after is not None:
                expected = expected * mistake.zeroed_after.to(expected)[:, None, None, :]
            if float((expected[selected] - chosen).abs().max()) > tolerance:
                continue
        found.append(mistake.kind)
    return found[0] if len(found) == 1 else None
