"""The suite's own q/k/v/out projections, for attention cores it wraps or times.

Two places need a module whose projections are correct by construction around a per-head
attention core (B, H, L, Dh): a plain core function being checked (inference wraps it, so every
failure is the function's) and the decode benchmark's SDPA baseline. Both are this class.
"""

from __future__ import annotations

import torch
from torch import nn


class HeadProjections(nn.Module):
    """``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (``nn.Linear(d_model, d_model)`` each,
    heads as row blocks: ``SeparateProjections("q_proj", "k_proj", "v_proj", "out_proj")``
    reads them); subclasses write ``forward`` with :meth:`heads` and :meth:`merge`."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def heads(self, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v projected and split into heads: (B, L, D) -> (B, H, L, Dh) each."""
        return tuple(proj(x).unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
                     for proj, x in ((self.q_proj, query), (self.k_proj, key),
                                     (self.v_proj, value)))

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        """The heads (B, H, L, Dh) concatenated and projected: (B, L, D)."""
        return self.out_proj(out.transpose(1, 2).flatten(2))
