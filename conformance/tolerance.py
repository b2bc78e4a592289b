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

UNCHANGED_ULPS = 4.0


def eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def magnitude(tensor: torch.Tensor) -> float:
    finite = tensor[torch.isfinite(tensor)]
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


def unchanged_tolerance(dtype: torch.dtype, reference: torch.Tensor) -> float:
    """Largest difference still read as "unchanged" for outputs like ``reference``."""
    return UNCHANGED_ULPS * eps(dtype) * magnitude(reference)


def abs_error(actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """|actual - expected| in float64, with NaN or inf where only one side is finite read as inf."""
    diff = (actual.detach().to(torch.float64).cpu() - expected.detach().to(torch.float64).cpu()).abs()
    return torch.nan_to_num(diff, nan=float("inf"))


def worst_index(error: torch.Tensor) -> tuple[int, ...]:
    """Index of the largest entry of ``error``."""
    flat = int(torch.argmax(error.reshape(-1)))
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), error.shape))


@dataclass(frozen=True)
class Agreement:
    """How an output compares with the float64 reference under the baseline rule."""

    max_error: float
    allowed: float
    baseline_error: float
    mean_error: float
    worst: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return self.max_error <= self.allowed


def only_rows(error: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """``error`` (B, L, ...) with the rows outside ``rows`` (B, L) bool set to 0."""
    if rows is None:
        return error
    shaped = rows.cpu().reshape(*rows.shape, *([1] * (error.dim() - rows.dim())))
    return torch.where(shaped, error, torch.zeros((), dtype=error.dtype))


def agreement(actual: torch.Tensor, reference: torch.Tensor, baseline: torch.Tensor,
              dtype: torch.dtype, rows: torch.Tensor | None = None) -> Agreement:
    """Compare ``actual`` with the float64 ``reference``, allowing K_MAX x the ``baseline``'s error.

    ``rows`` (B, L) bool restricts the comparison to those rows (rows with a key to attend to).
    """
    error = only_rows(abs_error(actual, reference), rows)
    baseline_error = (float(only_rows(abs_error(baseline, reference), rows).max())
                      if error.numel() else 0.0)
    allowed = K_MAX * baseline_error + FLOORS.get(dtype, 1e-5) * magnitude(
        only_rows(reference.detach().to(torch.float64).cpu(), rows))
    if not error.numel():
        return Agreement(0.0, allowed, baseline_error, 0.0, ())
    return Agreement(max_error=float(error.max()), allowed=allowed,
                     baseline_error=baseline_error, mean_error=float(error.mean()),
                     worst=worst_index(error))
