"""The float64 reproduction inference finds weights and encodings by: the sizes it builds a
module at, and its inputs."""

from __future__ import annotations

from collections.abc import Callable

import torch

from conformance.inference.observing.probe_length import probe_length
from conformance.subject.boundary import Inputs
from conformance.subject.in_process import ModuleInstance

Build = Callable[[int, int, "int | None"], ModuleInstance]
"""Builds the module in float64 for (num_heads, head_dim, num_kv_heads)."""

LENGTH = 11
"""Tokens in the reproduction's inputs: enough positions to tell RoPE's thetas apart."""


def probe_inputs(call: str, heads: int, head_dim: int, length: int, seed: int = 11) -> Inputs:
    """float64 inputs for the reproduction: batch 2, ``length`` tokens (the module's one
    length, where it takes one)."""
    length = probe_length(length)
    generator = torch.Generator().manual_seed(seed)
    width = heads * head_dim

    def tensor() -> torch.Tensor:
        return torch.randn(2, length, width, generator=generator, dtype=torch.float64)

    if call == "self":
        return Inputs.self_attention(tensor())
    if call == "cross":
        query, context = tensor(), tensor()
        return Inputs(query, context, context)
    return Inputs(tensor(), tensor(), tensor())


def reproduction_pair(pairs: tuple[tuple[int, int], ...] | None, single_head: bool) -> tuple[int, int]:
    """The reproduction's (heads, head_dim): 4 heads of 8 (1 for a single-head module), or the
    buildable pair nearest. Eight dimensions a head tell RoPE's pairings and rotated fractions
    apart (with two, half-split and interleaved pairs are the same)."""
    preferred = (1 if single_head else 4, 8)
    if pairs is None or preferred in pairs:
        return preferred
    return min(pairs, key=lambda p: (abs(p[0] - preferred[0]) + abs(p[1] - 8), p))


def other_pair(pairs: tuple[tuple[int, int], ...] | None, heads: int) -> tuple[int, int] | None:
    options = pairs if pairs is not None else tuple((h, 4) for h in (2, 3, 6))
    others = [p for p in options if p[0] != heads and p[0] > 1]
    return min(others, key=lambda p: (abs(p[0] - 3), abs(p[1] - 4), p)) if others else None
