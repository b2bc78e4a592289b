"""How a sliding-window argument counts: the keys a row sees (itself included), or the keys
before it.

HuggingFace's ``sliding_window=W`` lets row t see t - W + 1 .. t (W keys); FlashAttention's
``window_size=(W, 0)`` lets it see t - W .. t (W + 1). The name ``sliding_window`` settles it
(HuggingFace's meaning); for other names the module is built with a window of 3 and a causal
row is probed: which earlier positions change it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from conformance.generation.cases import Case
from conformance.inference.calls.chunk import dependence
from conformance.subject.boundary import ImplementationError, Instance

SETTLED = {"sliding_window": "keys", "sliding_window_size": "keys", "max_attend_past": "left"}
"""Names whose meaning settles the count (HuggingFace's configs)."""
PROBE_WINDOW = 3
LENGTH = 8

CONVENTION_WORDS = {"keys": "W keys per row, itself included (HuggingFace's sliding_window)",
                    "left": "W keys before the row, plus itself (FlashAttention's "
                            "window_size=(W, 0))"}


def seen_positions(instance: Instance, case: Case, call: str) -> list[int]:
    """The positions whose inputs change the last row's output."""
    return [int(p) for p in torch.nonzero(dependence(instance, case, call)[-1]).flatten()]


def probe_convention(build: Callable[[int], Instance], case: Case,
                     call: str) -> tuple[str | None, list[int]]:
    """("keys" or "left", the positions the last row sees) with the window built as
    PROBE_WINDOW; None when it is neither."""
    try:
        seen = seen_positions(build(PROBE_WINDOW), case, call)
    except ImplementationError:
        return None, []
    last = case.q_len - 1
    for convention, count in (("keys", PROBE_WINDOW), ("left", PROBE_WINDOW + 1)):
        if seen == list(range(last - count + 1, last + 1)):
            return convention, seen
    return None, seen
