"""Mutant: RoPE frequencies with the wrong exponent.

Bug: ``theta ** (-torch.arange(0, d)[: d // 2] / d)``: the step-2 arange written as step 1, so
pair i turns at theta^(-i/d) instead of theta^(-2i/d), the frequencies of a RoPE with theta
sqrt(10000) = 100 although the module states (and its constructor takes) theta 10000.
Symptom: still a relative encoding (position_shift passes, decoding agrees with the full
forward); the output differs from the float64 reference with RoPE at the stated theta.
Caught by: ``reference`` (hint: "matches RoPE with theta 100 instead of 10000").
"""

from __future__ import annotations

import torch

from conformance.implementations.modern import LlamaAttention, rotate_half_pairs
from conformance.implementations.modern_declared import ROPE_THETA_ARGUMENT, declare_llama

CATCHES = "reference"


class RopeThetaExponent(LlamaAttention):
    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 rope_theta: float = 10000.0) -> None:
        super().__init__(d_model, num_heads, num_kv_heads)
        self.rope_theta = rope_theta

    def rotate(self, q, k, positions):
        d = self.head_dim
        inv_freq = self.rope_theta ** (-torch.arange(0, d, dtype=torch.float64)[: d // 2] / d)
        angles = (positions.to(torch.float64)[..., None] * inv_freq.to(positions.device))[:, None]
        return rotate_half_pairs(q, angles), rotate_half_pairs(k, angles)


IMPLEMENTATION = declare_llama("mutant-rope-theta-exponent", RopeThetaExponent, benchmark=False,
                               configured=ROPE_THETA_ARGUMENT,
                               description="RoPE frequencies theta^(-i/d) (step 1, not 2)")
