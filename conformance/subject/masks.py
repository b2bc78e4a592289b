"""Encode the suite's canonical key-padding mask in an implementation's declared convention.

The canonical mask is a boolean ``keep`` tensor of shape (batch, kv_len): True = the key takes part;
or, for patterns that differ from row to row (a block-diagonal mask over packed sequences), of
shape (batch, q_len, kv_len), which only the layouts with a query axis can express.
"""

from __future__ import annotations

import torch

from conformance.errors import ConformanceError
from conformance.model.mask_forms import LAYOUT_SHAPES, MaskConvention, MaskKind, MaskLayout


class MaskEncodingError(ConformanceError, ValueError):
    """The canonical mask can't be expressed in the convention (a shared (Lq, Lk) mask for
    batch elements with different padding, a per-row pattern in a layout without a query axis)."""


def with_causality(keep: torch.Tensor, q_len: int, window: int | None = None,
                   chunk: int | None = None) -> torch.Tensor:
    """``keep`` (B, Lk) or (B, Lq, Lk) with the causal triangle folded in, aligned bottom-right
    (the last query is the last key; a cached call's queries come last), a sliding window of
    ``window`` keys and chunks of ``chunk`` positions: (B, Lq, Lk)."""
    kv_len = keep.shape[-1]
    rows = torch.arange(kv_len - q_len, kv_len, device=keep.device)[:, None]
    cols = torch.arange(kv_len, device=keep.device)[None, :]
    allowed = cols <= rows
    if window is not None:
        allowed = allowed & (rows - cols < window)
    if chunk is not None:
        allowed = allowed & (rows // chunk == cols // chunk)
    shaped = keep[:, None, :] if keep.dim() == 2 else keep
    return shaped & allowed


def encode_mask(keep: torch.Tensor, convention: MaskConvention, *, num_heads: int, q_len: int,
                dtype: torch.dtype, causal: bool = False,
                window: int | None = None, chunk: int | None = None) -> torch.Tensor:
    """``keep`` (B, Lk) or (B, Lq, Lk) bool -> the tensor the implementation expects for
    ``convention`` (for a causal call of a convention that carries causality, with the causal
    triangle, ``window`` and ``chunk`` folded in)."""
    if convention.kind is MaskKind.LENGTHS:
        return valid_lengths(keep, convention.layout, q_len)
    if causal and convention.carries_causality:
        keep = with_causality(keep, q_len, window, chunk)
    if keep.dim() == 3:
        shaped = _per_query(keep, convention.layout, num_heads)
    else:
        shaped = _key_padding(keep, convention.layout, num_heads, q_len)

    kind = convention.kind
    if kind is MaskKind.KEEP_INT:
        return shaped.to(torch.int64)
    if kind is MaskKind.KEEP_INT32:
        return shaped.to(torch.int32)
    if kind is MaskKind.KEEP_BOOL:
        return shaped
    if kind is MaskKind.IGNORE_BOOL:
        return ~shaped
    if kind is MaskKind.KEEP_FLOAT:
        return shaped.to(dtype)
    fill = torch.finfo(dtype).min if kind is MaskKind.ADDITIVE_MIN else float("-inf")
    additive = torch.zeros(shaped.shape, dtype=dtype, device=keep.device)
    return additive.masked_fill(~shaped, fill)


def valid_lengths(keep: torch.Tensor, layout: MaskLayout, q_len: int) -> torch.Tensor:
    """``keep`` (B, Lk) or (B, Lq, Lk) as valid lengths: (B,) for ``PER_SEQUENCE``, (B, Lq)
    for ``PER_ROW`` (int64); a mask that keeps a key after a masked one has none."""
    lengths = keep.sum(dim=-1)
    prefix = torch.arange(keep.shape[-1], device=keep.device) < lengths[..., None]
    if not torch.equal(prefix, keep):
        raise MaskEncodingError("valid lengths mask only the keys past a length: this mask "
                                "keeps a key after a masked one")
    if layout is MaskLayout.PER_SEQUENCE:
        if lengths.dim() == 2:
            if not bool((lengths == lengths[:, :1]).all()):
                raise MaskEncodingError("one valid length per sequence can't give its rows "
                                        "different keys")
            lengths = lengths[:, 0]
        return lengths.to(torch.int64)
    if lengths.dim() == 1:
        lengths = lengths[:, None].expand(-1, q_len)
    return lengths.contiguous().to(torch.int64)


def _key_padding(keep: torch.Tensor, layout: MaskLayout, num_heads: int,
                 q_len: int) -> torch.Tensor:
    """(B, Lk) key padding in ``layout``."""
    batch, kv_len = keep.shape
    if layout is MaskLayout.KEY_PADDING:
        return keep
    if layout is MaskLayout.BROADCAST:
        return keep[:, None, None, :]
    if layout is MaskLayout.ROWS_BROADCAST:
        return keep[:, None, :]
    if layout is MaskLayout.PER_QUERY:
        return keep[:, None, :].expand(batch, q_len, kv_len).contiguous()
    if layout is MaskLayout.PER_QUERY_BROADCAST:
        return keep[:, None, None, :].expand(batch, 1, q_len, kv_len).contiguous()
    if layout is MaskLayout.SHARED:
        if batch and not bool((keep == keep[:1]).all()):
            raise MaskEncodingError("a shared (Lq, Lk) mask can't give batch elements different "
                                    "padding")
        return keep[0][None, :].expand(q_len, kv_len).contiguous()
    return keep[:, None, None, :].expand(batch, num_heads, q_len, kv_len).contiguous()


def _per_query(keep: torch.Tensor, layout: MaskLayout, num_heads: int) -> torch.Tensor:
    """(B, Lq, Lk) in a layout that has a query axis."""
    batch, q_len, kv_len = keep.shape
    if layout is MaskLayout.PER_QUERY:
        return keep
    if layout is MaskLayout.PER_QUERY_BROADCAST:
        return keep[:, None]
    if layout is MaskLayout.PER_HEAD:
        return keep[:, None].expand(batch, num_heads, q_len, kv_len).contiguous()
    if layout is MaskLayout.SHARED:
        if batch and not bool((keep == keep[:1]).all()):
            raise MaskEncodingError("a shared (Lq, Lk) mask can't give batch elements different "
                                    "patterns")
        return keep[0]
    raise MaskEncodingError(f"a mask of shape {LAYOUT_SHAPES[layout]} has no query axis: it "
                            "can't give rows different keys")
