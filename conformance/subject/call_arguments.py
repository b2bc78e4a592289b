"""Encode the suite's plain call data as an implementation's own arguments: token positions,
packed variable-length sequences.

Both sides of the boundary speak plain data (:class:`conformance.subject.boundary.Inputs`: a first
position, a tuple of sequence lengths); this is where the implementation's side turns them into
what its forward takes.
"""

from __future__ import annotations

import torch

from conformance.model.forms import PositionForm


def positions_argument(form: PositionForm, start: int, batch: int, length: int,
                       device: torch.device | str) -> torch.Tensor | int:
    """Positions ``start .. start + length - 1`` in ``form``: (B, L) int64 ids, an (L,) int64
    vector, or the int ``start``."""
    if form is PositionForm.START:
        return start
    vector = torch.arange(start, start + length, device=device)
    if form is PositionForm.VECTOR:
        return vector
    return vector[None, :].expand(batch, length).contiguous()


def cu_seqlens(lengths: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
    """Cumulative sequence lengths ``[0, l_1, l_1 + l_2, ...]``, int32 (FlashAttention's varlen
    convention)."""
    total = torch.tensor((0, *lengths), dtype=torch.int64).cumsum(0)
    return total.to(dtype=torch.int32, device=device)


def block_diagonal(lengths: tuple[int, ...], batch: int, causal: bool,
                   device: torch.device | str) -> torch.Tensor:
    """(B, T, T) bool keep mask for sequences of ``lengths`` packed along T = sum(lengths): each
    token sees only its own sequence (and, ``causal``, only its own past)."""
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    keep = segment[:, None] == segment[None, :]
    if causal:
        keep = keep & torch.ones_like(keep).tril()
    return keep[None].expand(batch, -1, -1).to(device)
