"""Mutant: RoPE's configured theta taken and never read.

Bug: the constructor takes ``rope_theta`` and stores it under another name, while the rotation
keeps the class's default base 10000 (the value written where the frequencies are computed).
Symptom: built with its default it is exactly the correct layer; built with
``rope_theta=500000`` (Llama 3's base) it still turns with 10000, so every check that builds it
with the default passes.
Caught by: ``configuration`` (built with another theta, its output still agrees with the
reference of the default: "the configured value is ignored").
"""

from __future__ import annotations

from conformance.implementations.modern import LlamaAttention
from conformance.implementations.modern_declared import ROPE_THETA_ARGUMENT, declare_llama

CATCHES = "configuration"


class RopeThetaIgnored(LlamaAttention):
    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 rope_theta: float = 10000.0) -> None:
        super().__init__(d_model, num_heads, num_kv_heads)
        self.configured_theta = rope_theta  # stored; rotate() reads self.rope_theta
        self.rope_theta = 10000.0


IMPLEMENTATION = declare_llama("mutant-rope-theta-ignored", RopeThetaIgnored, benchmark=False,
                               configured=ROPE_THETA_ARGUMENT,
                               description="rope_theta taken, RoPE always at 10000")
