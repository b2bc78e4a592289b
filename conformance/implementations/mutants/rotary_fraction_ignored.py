"""Mutant: a partial rotary fraction taken but not applied.

Bug: the constructor takes ``partial_rotary_factor=0.5`` (GPT-NeoX / Phi style: RoPE on the
first half of each head's dimensions, the rest passed through) and stores it, but the rotation
still turns every dimension of the head, with frequencies over the whole head width.
Symptom: still relative (position_shift passes); the output differs from the float64 reference
with RoPE on the stated half of the dimensions.
Caught by: ``reference`` (hint: "matches RoPE rotating 8 of 8 dimensions per head instead of 4").
"""

from __future__ import annotations

from conformance import PositionEncoding, Rotary
from conformance.implementations.modern import LlamaAttention
from conformance.implementations.modern_declared import declare_llama

CATCHES = "reference"


class RotaryFractionIgnored(LlamaAttention):
    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 partial_rotary_factor: float = 0.5) -> None:
        super().__init__(d_model, num_heads, num_kv_heads)
        self.partial_rotary_factor = partial_rotary_factor  # stored, never used by rotate()


IMPLEMENTATION = declare_llama(
    "mutant-rotary-fraction-ignored", RotaryFractionIgnored, benchmark=False,
    position={"encoding": PositionEncoding(rotary=Rotary("half", 10000.0, fraction=0.5))},
    description="partial_rotary_factor taken, every dimension rotated")
