"""The suite's own q/k/v/out projections, for attention cores it wraps or times.

Two places need a module whose projections are correct by construction around a per-head
attention core (B, H, L, Dh): a plain core function being checked (inference wraps it, so every
failure is the function's) and the decode benchmark's SDPA baseline. Both are this class.
"""

from __future__ import annotations

import torch
from torch import nn


class HeadProjections(nn.Module):
    """``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (``nn.Linear``, heads as row blocks;
    the key and value projections ``num_kv_heads`` heads wide where grouped:
    ``SeparateProjections("q_proj", "k_proj", "v_proj", "out_proj")`` reads them); subclasses
    write ``forward`` with :meth:`heads` and :meth:`merge`."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        width = d_model // num_heads * self.num_kv_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, width)
        self.v_proj = nn.Linear(d_model, width)
        self.out_proj = nn.Linear(d_model, d_model)

    def heads(self, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v projected and split into heads: (B, L, D) -> (B, H, L, Dh), the key/value
        heads (fewer where ``num_kv_heads`` says so) alike."""
        return tuple(proj(x).unflatten(-1, (count, -1)).transpose(1, 2)
                     for proj, x, count in ((self.q_proj, query, self.num_heads),
                                            (self.k_proj, key, self.num_kv_heads),
                                            (self.v_proj, value, self.num_kv_heads)))

    def merge(self, out: torch.Tensor) -> torch.Tensor:
        """The heads (B, H, L, Dh) concatenated and projected: (B, L, D)."""
        return self.out_proj(out.transpose(1, 2).flatten(2))
