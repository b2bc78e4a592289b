"""Mutant: packed sequence boundaries read from cu_seqlens off by one.

Bug: each token's sequence found with ``torch.searchsorted(cu_seqlens[1:], positions)`` and the
default ``right=False``: the token at a boundary ``cu_seqlens[i + 1]``, the first of sequence
i + 1, is counted in sequence i, so it attends to the previous sequence and its own sequence's
later tokens don't see it. Symptom: a packed batch differs from the sequences run alone, first at
the first token of the second sequence. Caught by: ``packed``.
"""

from __future__ import annotations

import torch

from conformance.implementations.modern import VarlenAttention
from conformance.implementations.modern_declared import declare_varlen

CATCHES = "packed"


class CuSeqlensOffByOne(VarlenAttention):
    def sequence_index(self, cu_seqlens, total):
        return torch.searchsorted(cu_seqlens[1:].to(torch.int64),
                                  torch.arange(total, device=cu_seqlens.device))


IMPLEMENTATION = declare_varlen("mutant-cu-seqlens-off-by-one", CuSeqlensOffByOne,
                                description="cu_seqlens boundaries off by one (searchsorted side)")
