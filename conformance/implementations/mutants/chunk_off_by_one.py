"""Mutant: causal chunks whose boundaries sit one position early.

Bug: the chunk ids are computed from 1-based positions, ``(t + 1) // C`` where ``t // C`` is
meant (Llama 4's chunked attention, its ``attention_chunk_size`` read as counting from 1).
Symptom: the first row of every chunk but the first sees the last position of the chunk before,
and the last position of each chunk starts the next. Caught by: ``chunked`` (and the chunked
reference: ``reference``, ``head_split``, ...).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.implementations.modern import SlidingWindowAttention
from conformance.implementations.modern_declared import declare_llama

CATCHES = "chunked"


class ChunkOffByOne(SlidingWindowAttention):
    """Causal attention in chunks of ``attention_chunk_size`` positions, the chunk ids off by
    one; no window, no position encoding, grouped-query heads."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 attention_chunk_size: int = 4) -> None:
        super().__init__(d_model, num_heads, num_kv_heads)
        self.window = None
        self.chunk = attention_chunk_size

    def allowed(self, q_len, kv_len, device, causal):
        rows = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        cols = torch.arange(kv_len, device=device)[None, :]
        return (cols <= rows) & ((rows + 1) // self.chunk == (cols + 1) // self.chunk)


IMPLEMENTATION = replace(
    declare_llama("mutant-chunk-off-by-one", ChunkOffByOne, chunk="config",
                  position={"positional": None, "relative": None, "argument": None,
                            "form": None}, benchmark=False,
                  description="causal chunk ids (t + 1) // C: boundaries one position early"),
    factory=lambda c: ChunkOffByOne(c.d_model, c.num_heads, c.num_kv_heads,
                                    attention_chunk_size=c.chunk or 1024, **dict(c.settings)))
