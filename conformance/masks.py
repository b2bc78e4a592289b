"""Encode the suite's canonical key-padding mask in an implementation's declared convention.

The canonical mask is a boolean ``keep`` tensor of shape (batch, kv_len): True = the key takes part.
"""

from __future__ import annotations

import torch

from conformance.spec import MaskConvention, MaskKind, MaskLayout


def encode_mask(keep: torch.Tensor, convention: MaskConvention, *, num_heads: int, q_len: int,
                dtype: torch.dtype) -> torch.Tensor:
    """``keep`` (B, Lk) bool -> the tensor the implementation expects for ``convention``."""
    batch, kv_len = keep.shape
    if convention.layout is MaskLayout.KEY_PADDING:
        shaped = keep
    elif convention.layout is MaskLayout.BROADCAST:
        shaped = keep[:, None, None, :]
    elif convention.layout is MaskLayout.PER_QUERY:
        shaped = keep[:, None, :].expand(batch, q_len, kv_len).contiguous()
    else:
        shaped = keep[:, None, None, :].expand(batch, num_heads, q_len, kv_len).contiguous()

    if convention.kind is MaskKind.KEEP_INT:
        return shaped.to(torch.int64)
    if convention.kind is MaskKind.KEEP_BOOL:
        return shaped
    if convention.kind is MaskKind.IGNORE_BOOL:
        return ~shaped
    additive = torch.zeros(shaped.shape, dtype=dtype, device=keep.device)
    return additive.masked_fill(~shaped, float("-inf"))
