"""Mutant: bool masks converted with True = masked.

Bug: bool masks are turned into an additive mask as ``mask * -1e9`` (True = masked), while int
masks use 1 = keep. Symptom: the bool format gives the output of the complementary mask.
Caught by: ``mask_formats``.
"""

from __future__ import annotations

import torch

from conformance import Dtypes, MaskConvention, MaskKind, MaskLayout
from conformance.implementations.mutants.textbook import TextbookAttention, declare

CATCHES = "mask_formats"


class BoolMaskInverted(TextbookAttention):
    def apply_mask(self, scores, mask):
        if mask is not None and mask.dtype == torch.bool:
            return scores + mask.to(scores.dtype) * -1e9
        return super().apply_mask(scores, mask)


IMPLEMENTATION = declare("mutant-bool-mask-inverted", BoolMaskInverted,
                         description="bool masks converted with True = masked",
                         mask_formats=(MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.BROADCAST),),
                         floats=Dtypes((torch.float32, torch.float64)))
