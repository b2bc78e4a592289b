"""Position encodings inside the module, read from names: rotary embeddings (RoPE) and ALiBi.

A module that rotates q and k by position (or adds a distance bias) is correct and yet not the
position-free attention the suite's float64 reference computes, nor permutation-equivariant.
Such a module is recognised by what it holds and takes (a ``rotary_emb`` submodule, an
``inv_freq`` or ``freqs_cis`` buffer, a ``position_ids`` argument, ALiBi ``slopes``), said in the
report, and the checks that assume position-free attention skip with that reason.
"""

from __future__ import annotations

from torch import nn

ROTARY_WORDS = ("rotary", "rope", "freqs_cis", "inv_freq", "cos_cached", "sin_cached")
ALIBI_WORDS = ("alibi", "slopes")


def _words(module: nn.Module) -> list[tuple[str, str]]:
    """(name, where) for every submodule, buffer and attribute name, and submodule class."""
    found = []
    for name, child in module.named_modules():
        if name:
            found.append((name.lower(), f"submodule {name}"))
            found.append((type(child).__name__.lower(), f"submodule {name} "
                                                        f"({type(child).__name__})"))
    for name, _ in module.named_buffers():
        found.append((name.lower(), f"buffer {name}"))
    for name in vars(module):
        if not name.startswith("_"):
            found.append((name.lower(), f"attribute {name}"))
    return found


def position_encoding(module: nn.Module, positions: tuple[str, ...]) -> tuple[str, str] | None:
    """("rotary", "alibi" or "positions", the evidence in words), or None for a position-free
    module.

    ``positions`` are the forward arguments that carry positions (see ForwardConvention).
    """
    words = _words(module)
    for kind, markers in (("rotary", ROTARY_WORDS), ("alibi", ALIBI_WORDS)):
        for text, where in words:
            if any(marker in text for marker in markers):
                return kind, where
    if positions:
        return "positions", f"forward argument {positions[0]}"
    return None
