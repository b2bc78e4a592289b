"""A correct multi-head attention wrapping ``torch.nn.MultiheadAttention(batch_first=True)``.

Its ``key_padding_mask`` is boolean with True = ignore (or additive float), shape (batch, kv_len);
causal through a boolean ``attn_mask`` when ``is_causal=True``; ``need_weights`` selects the slow
path that also computes the weights; the tuple output is reduced to the attention output.
"""

from __future__ import annotations

import torch
from torch import nn

from conformance import (
    Capabilities,
    CausalForm,
    Dtypes,
    Implementation,
    MaskConvention,
    MaskKind,
    MaskLayout,
    PackedInProjection,
)


class TorchMultiheadAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(d_model, num_heads, dropout=dropout,
                                               batch_first=True)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, is_causal: bool = False,
                need_weights: bool = False) -> torch.Tensor:
        attn_mask = None
        if is_causal:
            attn_mask = torch.ones(query.shape[1], key.shape[1], dtype=torch.bool,
                                   device=query.device).triu(diagonal=1)
        output, _ = self.attention(query, key, value, key_padding_mask=key_padding_mask,
                                   attn_mask=attn_mask, need_weights=need_weights)
        return output


IMPLEMENTATION = Implementation(
    "reference-torch-mha",
    lambda c: TorchMultiheadAttention(c.d_model, c.num_heads, c.dropout),
    Capabilities(call="qkv",
                 mask=MaskConvention(MaskKind.IGNORE_BOOL, MaskLayout.KEY_PADDING,
                                     argument="key_padding_mask"),
                 mask_formats=(MaskConvention(MaskKind.ADDITIVE, MaskLayout.KEY_PADDING,
                                              argument="key_padding_mask"),),
                 causality=CausalForm("optional", "is_causal"), cross_attention=True,
                 floats=Dtypes((torch.float32, torch.float64, torch.float16, torch.bfloat16)),
                 dropout="config", paths=(("need_weights=True", (("need_weights", True),)),)),
    PackedInProjection("attention"),
    description="correct reference: torch.nn.MultiheadAttention(batch_first=True)",
)
