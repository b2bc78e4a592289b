"""Encode the suite's canonical key-padding mask in an implementation's declared convention.

The canonical mask is a boolean ``keep`` tensor of shape (batch, kv_len): True = the key takes part.
"""

from __future__ import annotations

import torch

from conformance.spec import MaskConvention, MaskKind, MaskLayout


class MaskEncodingError(ValueError):
    """The canonical mask can't be expressed in the convention (a shared (Lq, Lk) mask for
    batch elements with different padding)."""


def encode_mask(keep: torch.Tensor, convention: MaskConvention, *, num_heads: int, q_len: int,
                dtype: torch.dtype) -> torch.Tensor:
    """``keep`` (B, Lk) bool -> the tensor the implementation expects for ``convention``."""
    batch, kv_len = keep.shape
    layout = convention.layout
    if layout is MaskLayout.KEY_PADDING:
        shaped = keep
    elif layout is MaskLayout.BROADCAST:
        shaped = keep[:, None, None, :]
    elif layout is MaskLayout.PER_QUERY:
        shaped = keep[:, None, :].expand(batch, q_len, kv_len).contiguous()
    elif layout is MaskLayout.PER_QUERY_BROADCAST:
        shaped = keep[:, None, None, :].expand(batch, 1, q_len, kv_len).contiguous()
    elif layout is MaskLayout.SHARED:
        if batch and not bool((keep == keep[:1]).all()):
            raise MaskEncodingError("a shared (Lq, Lk) mask can't give batch elements different "
                                    "padding")
        shaped = keep[0][None, :].expand(q_len, kv_len).contiguous()
    else:
        shaped = keep[:, None, None, :].expand(batch, num_heads, q_len, kv_len).contiguous()

    kind = convention.kind
    if kind is MaskKind.KEEP_INT:
        return shaped.to(torch.int64)
    if kind is MaskKind.KEEP_BOOL:
        return shaped
    if kind is MaskKind.IGNORE_BOOL:
        return ~shaped
    if kind is MaskKind.KEEP_FLOAT:
        return shaped.to(dtype)
    fill = torch.finfo(dtype).min if kind is MaskKind.ADDITIVE_MIN else float("-inf")
    additive = torch.zeros(shaped.shape, dtype=dtype, device=keep.device)
    return additive.masked_fill(~shaped, fill)
