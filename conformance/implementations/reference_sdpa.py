"""A correct multi-head attention built on ``F.scaled_dot_product_attention`` (a reference).

Boolean mask with True = attend, or an additive float mask, shape (batch, 1, 1, kv_len) or
(batch, heads, q_len, kv_len); causal when ``is_causal=True``; cross-attention; dropout only in
training. A row with every key masked gives zero weights (SDPA's behaviour since PyTorch 2.5).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from conformance import (
    Capabilities,
    CausalForm,
    Dtypes,
    Implementation,
    MaskConvention,
    MaskKind,
    MaskLayout,
    SeparateProjections,
)


class SDPAAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError("d_model must be divisible by num_heads")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        q, k, v = self._heads(self.q_proj(query)), self._heads(self.k_proj(key)), self._heads(
            self.v_proj(value))
        if is_causal and mask is not None:
            # SDPA takes either an explicit mask or is_causal: fold causality into the mask.
            future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool,
                                device=q.device).triu(diagonal=1)
            mask = (mask & ~future if mask.dtype == torch.bool
                    else mask.masked_fill(future, float("-inf")))
            is_causal = False
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                             dropout_p=self.dropout if self.training else 0.0)
        batch, _, length, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, -1))


IMPLEMENTATION = Implementation(
    "reference-sdpa",
    lambda c: SDPAAttention(c.d_model, c.num_heads, c.dropout),
    Capabilities(call="qkv", mask=MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.BROADCAST),
                 mask_formats=(MaskConvention(MaskKind.ADDITIVE, MaskLayout.BROADCAST),
                               MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.PER_HEAD),
                               MaskConvention(MaskKind.ADDITIVE, MaskLayout.PER_HEAD)),
                 causality=CausalForm("optional", "is_causal"), cross_attention=True,
                 floats=Dtypes((torch.float32, torch.float64, torch.float16, torch.bfloat16)),
                 dropout="config", fully_masked="zeros"),
    SeparateProjections(q="q_proj", k="k_proj", v="v_proj", o="out_proj"),
    description="correct reference: F.scaled_dot_product_attention with q/k/v/out projections",
)
