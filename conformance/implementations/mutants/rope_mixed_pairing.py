"""Mutant: q and k rotated with different RoPE pairings.

Bug: the queries are rotated on half-split pairs (HuggingFace's ``rotate_half``, dimension i with
i + Dh/2), the keys on interleaved pairs (Meta's complex ``freqs_cis``, 2i with 2i + 1): a port
mixing the two conventions, or a checkpoint converted for one layout and run with the other.
Symptom: q_i . k_j no longer depends on i - j alone; the model still runs, cached decoding still
agrees with the full forward. Caught by: ``position_shift``.
"""

from __future__ import annotations

from conformance.implementations.modern import (
    LlamaAttention,
    rotary_angles,
    rotate_half_pairs,
    rotate_interleaved_pairs,
)
from conformance.implementations.modern_declared import declare_llama

CATCHES = "position_shift"


class RopeMixedPairing(LlamaAttention):
    def rotate(self, q, k, positions):
        angles = rotary_angles(positions, self.head_dim, self.rope_theta)[:, None]
        return rotate_half_pairs(q, angles), rotate_interleaved_pairs(k, angles)


IMPLEMENTATION = declare_llama("mutant-rope-mixed-pairing", RopeMixedPairing, benchmark=False,
                               description="q rotated half-split, k interleaved")
