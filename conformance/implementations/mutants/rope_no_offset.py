"""Mutant: RoPE positions not offset during cached decoding.

Bug: a module that computes its tokens' positions itself (no ``position_ids`` argument) takes
``arange(L)`` for the tokens of each call, not ``arange(P, P + L)`` after P cached tokens: every
decoded token is rotated as position 0 (and its key is cached so).
Symptom: the plain forward and the prefill are right; decode steps differ from the full forward.
Caught by: ``kv_cache``.
"""

from __future__ import annotations

import torch

from conformance.implementations.modern import LlamaAttention
from conformance.implementations.modern_declared import declare_llama

CATCHES = "kv_cache"


class RopeNoOffset(LlamaAttention):
    def forward(self, x, attention_mask=None, past_key_value=None, use_cache=False):
        return super().forward(x, attention_mask, None, past_key_value, use_cache)

    def default_positions(self, past_length, length, batch, device):
        return torch.arange(length, device=device)[None, :].expand(batch, length)


IMPLEMENTATION = declare_llama("mutant-rope-no-offset", RopeNoOffset, benchmark=False,
                               position={"argument": None, "form": None},
                               description="RoPE positions restart at 0 in every decode call")
