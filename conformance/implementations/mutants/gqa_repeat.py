"""Mutant: grouped-query key/value heads expanded with ``repeat`` instead of ``repeat_interleave``.

Bug: ``k.repeat(1, G, 1, 1)`` tiles the key/value heads ([k0, k1, k0, k1]) where the projections
group them ([k0, k0, k1, k1]): query head h reads key/value head h mod Hkv instead of h // G (onnx
#7274, VeOmni #162). Shapes all agree, so nothing raises; a model trained this way is just a
different model, and checkpoints from the other layout load silently wrong. Symptom: changing
key/value head 0 changes query heads 0, 2, ... instead of 0, 1. Caught by: ``kv_groups`` (and the
grouped reference: ``head_split``, ``reference``).
"""

from __future__ import annotations

from conformance.implementations.modern import SlidingWindowAttention
from conformance.implementations.modern_declared import declare_llama

CATCHES = "kv_groups"


class GQARepeat(SlidingWindowAttention):
    def expand_kv(self, x):
        return x.repeat(1, self.num_heads // self.num_kv_heads, 1, 1)


IMPLEMENTATION = declare_llama(
    "mutant-gqa-repeat", GQARepeat, window="config",
    position={"positional": None, "relative": None, "argument": None, "form": None}, benchmark=False,
    description="key/value heads expanded with repeat, not repeat_interleave")
