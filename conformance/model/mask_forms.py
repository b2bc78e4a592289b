"""How an implementation takes a padding mask: the kind of its values (:class:`MaskKind`), its
shape (:class:`MaskLayout`) and the argument it comes through (:class:`MaskConvention`), and
their words. Plain data, as :mod:`conformance.model.forms` is."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class MaskKind(str, Enum):
    """How mask values are read."""

    KEEP_INT = "keep_int"
    """Integer tensor (int64), 1 = attend, 0 = masked (``masked_fill(mask == 0, ...)``)."""
    KEEP_INT32 = "keep_int32"
    """Integer tensor of dtype int32, 1 = attend, 0 = masked (``mask.int()``: what many
    assignments and tokenizers hand out)."""
    KEEP_BOOL = "keep_bool"
    """Boolean tensor, True = attend (``F.scaled_dot_product_attention``'s ``attn_mask``)."""
    IGNORE_BOOL = "ignore_bool"
    """Boolean tensor, True = masked (``nn.MultiheadAttention``'s ``key_padding_mask``)."""
    KEEP_FLOAT = "keep_float"
    """Float tensor in the input's dtype, 1.0 = attend, 0.0 = masked (HuggingFace's raw
    ``attention_mask``, turned into ``(1 - mask) * finfo.min`` inside)."""
    ADDITIVE = "additive"
    """Float tensor added to the logits: 0 = attend, -inf = masked."""
    ADDITIVE_MIN = "additive_min"
    """Float tensor added to the logits: 0 = attend, ``torch.finfo(dtype).min`` = masked."""
    LENGTHS = "lengths"
    """Integer valid lengths (int64): the keys at and past each length are masked (d2l's
    ``valid_lens``). Only right padding can be said so; its layouts are :data:`LENGTH_LAYOUTS`."""


class MaskLayout(str, Enum):
    """The shape the mask argument is given in."""

    KEY_PADDING = "key_padding"
    """(batch, kv_len)."""
    BROADCAST = "broadcast"
    """(batch, 1, 1, kv_len), broadcast over heads and query rows."""
    ROWS_BROADCAST = "rows_broadcast"
    """(batch, 1, kv_len), broadcast over the query rows: the Annotated Transformer's source
    mask, given its head axis inside the layer (``mask.unsqueeze(1)``)."""
    PER_QUERY = "per_query"
    """(batch, q_len, kv_len)."""
    PER_QUERY_BROADCAST = "per_query_broadcast"
    """(batch, 1, q_len, kv_len), broadcast over heads (HuggingFace's 4-D masks)."""
    PER_HEAD = "per_head"
    """(batch, num_heads, q_len, kv_len)."""
    SHARED = "shared"
    """(q_len, kv_len), one mask for the whole batch (``nn.MultiheadAttention``'s 2-D
    ``attn_mask``): only masks that are the same for every batch element can be given."""
    PER_SEQUENCE = "per_sequence"
    """(batch,): one valid length per sequence (:attr:`MaskKind.LENGTHS` only)."""
    PER_ROW = "per_row"
    """(batch, q_len): one valid length per query (:attr:`MaskKind.LENGTHS` only)."""


QUERY_AXIS_LAYOUTS = (MaskLayout.PER_QUERY, MaskLayout.PER_QUERY_BROADCAST,
                      MaskLayout.PER_HEAD, MaskLayout.SHARED, MaskLayout.PER_ROW)
"""Mask layouts with a query axis: those that can give rows different keys."""


@dataclass(frozen=True)
class MaskConvention:
    """How the implementation takes a padding mask.

    ``argument`` names the keyword it is passed as; ``None`` passes it positionally after the
    inputs.
    """

    kind: MaskKind
    layout: MaskLayout
    argument: str | None = None
    carries_causality: bool = False
    """The module takes the mask as the whole mask, causality included (HuggingFace's 4-D
    masks, torchtune's): for a causal call the suite folds the causal triangle (and a sliding
    window) into it. Only layouts with a query axis can."""

    def describe(self) -> str:
        return (f"{KIND_WORDS[self.kind]}, shape {LAYOUT_SHAPES[self.layout]}"
                + (", the causal triangle included (the mask is the whole mask)"
                   if self.carries_causality else ""))

    def spec(self) -> str:
        """The declaration that states this convention: ``KIND:LAYOUT[+causal][@ARGUMENT]``."""
        argument = f"@{self.argument}" if self.argument else ""
        causal = "+causal" if self.carries_causality else ""
        return f"{self.kind.value}:{self.layout.value}{causal}{argument}"


KIND_WORDS = {
    MaskKind.KEEP_INT: "int mask, 0 = masked",
    MaskKind.KEEP_INT32: "int32 mask, 0 = masked",
    MaskKind.KEEP_BOOL: "bool mask, True = attend",
    MaskKind.IGNORE_BOOL: "bool mask, True = ignore",
    MaskKind.KEEP_FLOAT: "float mask, 1.0 = attend, 0.0 = masked",
    MaskKind.ADDITIVE: "additive float mask, -inf = masked",
    MaskKind.ADDITIVE_MIN: "additive float mask, finfo.min = masked",
    MaskKind.LENGTHS: "valid lengths, the keys past each length masked",
}
LAYOUT_SHAPES = {
    MaskLayout.KEY_PADDING: "(B, Lk)",
    MaskLayout.BROADCAST: "(B, 1, 1, Lk)",
    MaskLayout.ROWS_BROADCAST: "(B, 1, Lk)",
    MaskLayout.PER_QUERY: "(B, Lq, Lk)",
    MaskLayout.PER_QUERY_BROADCAST: "(B, 1, Lq, Lk)",
    MaskLayout.PER_HEAD: "(B, H, Lq, Lk)",
    MaskLayout.SHARED: "(Lq, Lk)",
    MaskLayout.PER_SEQUENCE: "(B,)",
    MaskLayout.PER_ROW: "(B, Lq)",
}
LENGTH_LAYOUTS = (MaskLayout.PER_SEQUENCE, MaskLayout.PER_ROW)
"""The layouts of valid lengths, and the only ones they have."""


def right_padded(mask: MaskConvention | None) -> bool:
    """Whether ``mask`` can only say right padding (valid lengths): its cases keep the first
    keys of each row."""
    return mask is not None and mask.kind is MaskKind.LENGTHS
