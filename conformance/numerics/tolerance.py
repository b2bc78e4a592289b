"""How close is close enough, per example rather than from a fixed table.

Agreement with the float64 reference: the implementation's largest error must be within
``K_MAX`` times the largest error of the suite's own plain attention computed in the same dtype
from the same weights and inputs (the baseline), plus a floor per dtype scaled by the output's
magnitude. This is the rule FlashAttention's and PyTorch's SDPA tests use: a low-precision result
is judged against what that precision can do on that very example, not against a constant. The
floor covers examples where the baseline happens to be nearly exact.

"Unchanged" (an input that must have no influence): a few units in the last place of the output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

K_MAX = 4.0
"""Allowed multiple of the same-dtype baseline's max error: room for another summation order or a
fused kernel, far below what a wrong scale, head split or mask produces."""

FLOORS: dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}
"""Absolute error always allowed, relative to max(1, |reference|max): about 80 ulps at 1.0."""

K_MEAN = 4.0
"""Allowed multiple of the baseline's mean error. The mean catches a systematic bias (every
element off by a little) that stays under the max rule."""

MEAN_FLOOR_FRACTION = 0.1
"""The mean rule's floor, as a fraction of the max rule's floor."""

MEAN_MIN_ELEMENTS = 64
"""Fewest compared elements for the mean rule to apply. A mean over a handful of elements is no
statistic: in float16 one output rounded differently is a unit in the last place, and the
baseline's own mean over two elements can be near 0 by luck (torch's nn.MultiheadAttention
failed on a 2-element case, thorough profile, seed 3). There the max rule judges alone."""

UNCHANGED_ULPS = 4.0

FLOAT64_AGREEMENT = 1e-13
"""Relative agreement with the float64 reference that float64 arithmetic gives, with 100x
margin: float64 attention, whatever its summation order or RoPE formula, agrees to about 1e-15.
A float64 run farther from the reference, by less than a bug gives, has a part computed at a
lower precision (see :mod:`conformance.checks.precision`); and a constant gap above this would
eat the float64 floor (FLOORS) of every comparison."""


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def magnitude(tensor: torch.Tensor) -> float:
    finite = tensor[torch.isfinite(tensor)]
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


def unchanged_tolerance(dtype: torch.dtype, reference: torch.Tensor) -> float:
    """Largest difference still read as "unchanged" for outputs like ``reference``."""
    return UNCHANGED_ULPS * eps(dtype) * magnitude(reference)


def reordering_tolerance(dtype: torch.dtype, reference: torch.Tensor) -> float:
    """Largest difference allowed between two computations of the same value that differ only in
    summation order or kernel (permuted tokens, a non-contiguous layout, a different batch size)."""
    return FLOORS.get(dtype, 1e-5) * magnitude(reference)


def abs_error(actual: torch.Tensor, expected: torch.Tensor, *, nan_equal: bool = False) -> torch.Tensor:
    """|actual - expected| in float64; NaN or inf where only one side is finite reads as inf.

    ``nan_equal``: NaN on both sides (or the same infinity) reads as 0, for comparing two runs of
    what should be the same computation.
    """
    a = actual.detach().to(torch.float64).cpu()
    e = expected.detach().to(torch.float64).cpu()
    diff = torch.nan_to_num((a - e).abs(), nan=float("inf"))
    if nan_equal:
        same = (torch.isnan(a) & torch.isnan(e)) | (torch.isinf(a) & (a == e))
        diff = torch.where(same, torch.zeros((), dtype=diff.dtype), diff)
    return diff


def worst_index(error: torch.Tensor) -> tuple[int, ...]:
    """Index of the largest entry of ``error``."""
    flat = int(torch.argmax(error.reshape(-1)))
    # In integers, not torch.unravel_index: that imports sympy on its first call (0.4 s of a
    # checker that otherwise never needs it).
    index = []
    for size in reversed(error.shape):
        flat, at = divmod(flat, size)
        index.append(at)
    return tuple(reversed(index))


@dataclass(frozen=True)
class Agreement:
    """How an output compares with the float64 reference under the baseline rule."""

    max_error: float
    allowed: float
    baseline_error: float
    mean_error: float
    mean_allowed: float
    worst: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return self.max_error <= self.allowed and self.mean_error <= self.mean_allowed

    def describe(self) -> str:
        """What failed, in numbers."""
        if self.max_error > self.allowed:
            return f"max error {self.max_error:.3g} (allowed {self.allowed:.3g})"
        return (f"mean error {self.mean_error:.3g} (allowed {self.mean_allowed:.3g}): a "
                "systematic bias")


def only_rows(error: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """``error`` (B, L, ...) with the rows outside ``rows`` (B, L) bool set to 0."""
    if rows is None:
        return error
    shaped = rows.cpu().reshape(*rows.shape, *([1] * (error.dim() - rows.dim())))
    return torch.where(shaped, error, torch.zeros((), dtype=error.dtype))


def logit_rounding(dtype: torch.dtype, largest_logit: float, reference: torch.Tensor) -> float:
    """Error a correct softmax may make when its logits are as large as ``largest_logit``.

    Rounding a logit of magnitude L costs about eps * L in absolute terms, which is a relative
    error of eps * L in its weight; the output moves by that times the values' magnitude. With
    L = 1e4 in float32 this is about 1e-3 relative: loose next to the usual floor, and nothing
    next to the inf and NaN a softmax without max subtraction gives there.
    """
    return 8 * eps(dtype) * largest_logit * magnitude(reference)


def agreement(actual: torch.Tensor, reference: torch.Tensor,
              baseline: torch.Tensor | Sequence[torch.Tensor], dtype: torch.dtype,
              rows: torch.Tensor | None = None, extra: float = 0.0) -> Agreement:
    """Compare ``actual`` with the float64 ``reference``, allowing K_MAX x the ``baseline``'s error.

    ``baseline`` may be several same-dtype computations (different rounding paths): each
    element's baseline error is the largest of theirs. ``rows`` (B, L) bool restricts the
    comparison to those rows (rows with a key to attend to). ``extra`` is added to both limits
    (see :func:`logit_rounding`).
    """
    error = only_rows(abs_error(actual, reference), rows)
    if not error.numel():
        return Agreement(0.0, 0.0, 0.0, 0.0, 0.0, ())
    baselines = [baseline] if isinstance(baseline, torch.Tensor) else list(baseline)
    baseline = only_rows(torch.stack([abs_error(b, reference) for b in baselines]).amax(0), rows)
    count = error.numel() if rows is None else max(
        1, int(rows.sum()) * (error.numel() // rows.numel()))
    floor = FLOORS.get(dtype, 1e-5) * magnitude(
        only_rows(reference.detach().to(torch.float64).cpu(), rows))
    return Agreement(
        max_error=float(error.max()), allowed=K_MAX * float(baseline.max()) + floor + extra,
        baseline_error=float(baseline.max()), mean_error=float(error.sum()) / count,
        mean_allowed=(K_MEAN * float(baseline.sum()) / count + MEAN_FLOOR_FRACTION * floor + extra
                      if count >= MEAN_MIN_ELEMENTS else math.inf),
        worst=worst_index(error))
