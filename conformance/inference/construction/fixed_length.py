"""A module that takes one input length, found by trial where its basic call fails.

Swin's window attention takes ``(num_windows * B, N, C)`` with ``N = Wh * Ww``, the tokens of one
window: its ``window_size`` sets the one length it takes, and it sizes a relative-position index
of N x N pairs (a window wider than any sequence, as a non-causal module's window argument is
otherwise built, asks for terabytes). So where the basic call fails at the probes' lengths, the
lengths it runs at are measured: for a window argument, at each of SIZES in turn, each taking
exactly one length, distinct, until one takes at least SHORTEST tokens; without one, as built.
That length is then the module's contract: inference probes it there, every case has it, the
checks that need another length skip saying so, and the report says so.
"""

from __future__ import annotations

from conformance.generation.cases import MAX_LEN
from conformance.inference.plan import Plan, runs
from conformance.model.remedies import Note
from conformance.model.spec import Config

SIZES = tuple(range(1, 7))
"""Values of a window argument tried, smallest first: whatever it sizes (a bias table, an index
of every pair of positions) stays small."""

SHORTEST = 6
"""The fewest tokens kept as the module's length where the argument can choose: the probes' own
length (their masks keep 3 and 4 of 6 keys)."""

HEADS, HEAD_DIM = 2, 4
"""The trial's sizes (one head where no argument sets the count)."""


def _runs(plan: Plan, length: int, window: int | None) -> bool:
    heads = HEADS if plan.roles.heads else plan.fixed_heads
    width = plan.fixed_width or heads * HEAD_DIM
    # window_offset is 0 until window_form: the value is passed as it is.
    return runs(plan, Config(batch=2, q_len=length, kv_len=length, d_model=width,
                             num_heads=heads, window=window))


def _taken(plan: Plan, window: int | None) -> list[int]:
    return [length for length in range(1, MAX_LEN + 1) if _runs(plan, length, window)]


def fixed_length(plan: Plan) -> Note | None:
    """Where a self-attention module's basic call fails at 3 and 6 tokens, the one length it
    takes (``plan.length``) and the window argument's value that sets it (``plan.length_window``),
    with what was measured; None (``plan`` unchanged) where it takes several or none."""
    if plan.convention.call != "self" or _runs(plan, 3, None) or _runs(plan, 6, None):
        return None
    name = plan.roles.window
    if name is None:
        taken = _taken(plan, None)
        if len(taken) != 1:
            return None
        plan.length = taken[0]
        return Note(f"it takes {plan.length} tokens only (found by trial: its forward runs at "
                    f"{plan.length} of 1 to {MAX_LEN} tokens and raises at every other); checked "
                    "at that length", None)
    measured: dict[int, int] = {}
    for size in SIZES:
        taken = _taken(plan, size)
        if len(taken) != 1 or taken[0] in measured.values():
            return None
        measured[size] = taken[0]
        if taken[0] >= SHORTEST:
            break
    else:
        return None
    if len(measured) < 2:  # one size alone shows no argument setting the length
        return None
    plan.length, plan.length_window = measured[size], size
    said = ", ".join(f"{name}={s}: {n}" for s, n in measured.items())
    return Note(f"{name}: sets the one input length it takes (found by trial, tokens it runs at: "
                f"{said}; every other length of 1 to {MAX_LEN} raises): built with {name}={size}, "
                f"checked at {plan.length} tokens only, not as a sliding window", None)
