"""Mutant: RoPE frequencies computed over d_model instead of the head width.

Bug: ``theta ** (-torch.arange(0, d, 2) / d_model)`` with ``d_model`` (the hidden size) where
the head's own width belongs: every pair turns too slowly, by an amount that depends on the head
count (theta^(-2i / (H Dh))).
Symptom: still relative (position_shift passes); the output differs from the float64 reference
with RoPE at the stated theta, differently for every head count.
Caught by: ``reference`` (hint: "matches RoPE frequencies computed over d_model").
"""

from __future__ import annotations

import torch

from conformance.implementations.modern import LlamaAttention, rotate_half_pairs
from conformance.implementations.modern_declared import ROPE_THETA_ARGUMENT, declare_llama

CATCHES = "reference"


class RopeOverDModel(LlamaAttention):
    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 rope_theta: float = 10000.0) -> None:
        super().__init__(d_model, num_heads, num_kv_heads)
        self.rope_theta = rope_theta
        self.d_model = d_model

    def rotate(self, q, k, positions):
        steps = torch.arange(0, self.head_dim, 2, dtype=torch.float64)
        inv_freq = self.rope_theta ** (-steps / self.d_model)
        angles = (positions.to(torch.float64)[..., None] * inv_freq.to(positions.device))[:, None]
        return rotate_half_pairs(q, angles), rotate_half_pairs(k, angles)


IMPLEMENTATION = declare_llama("mutant-rope-over-d-model", RopeOverDModel, benchmark=False,
                               configured=ROPE_THETA_ARGUMENT,
                               description="RoPE frequencies over d_model, not the head width")
