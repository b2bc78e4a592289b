"""Mutant: a key-padding mask applied along the query axis.

Bug: ``scores.masked_fill(key_padding_mask[:, None, :, None], -inf)`` in self-attention: the
(B, L) mask is broadcast over the keys instead of the queries, so padded positions lose their
rows (NaN, at padded queries, whose output is unspecified) while every kept row still attends to
the padded keys. The mask is ``nn.MultiheadAttention``'s kind (True = padding), and (B, L) is the
only shape it takes.
Symptom: masked keys change the outputs of kept rows: the only mask convention that runs leaks.
Caught by: ``padding`` (the leak with its counterexample; the convention said to be assumed).
"""

from __future__ import annotations

import torch

from conformance import MaskConvention, MaskKind, MaskLayout
from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "padding"


class MaskOnQueryAxis(TextbookAttention):
    def forward(self, x, key_padding_mask=None):
        return super().forward(x, x, x, key_padding_mask)

    def apply_mask(self, scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            return scores
        return scores.masked_fill(mask[:, None, :, None], float("-inf"))


IMPLEMENTATION = declare(
    "mutant-mask-on-query-axis", MaskOnQueryAxis,
    mask=MaskConvention(MaskKind.IGNORE_BOOL, MaskLayout.KEY_PADDING, "key_padding_mask"),
    call="self", mask_formats=(), cross_attention=False,
    description="a (B, Lk) key-padding mask applied along the query axis")
