"""What a causal row sees, measured: the positions whose inputs change each output row.

Causal chunked attention (Llama 4's ``attention_chunk_size``) lets row t see C * (t // C) .. t.
An argument named for chunks may also set a computation tile that changes nothing a row sees,
and a module may fix its chunk itself: the pattern at LENGTH positions tells which.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import torch

from conformance.generation.cases import Case
from conformance.numerics.reference import allowed_keys
from conformance.numerics.tolerance import abs_error, unchanged_tolerance
from conformance.subject.boundary import ImplementationError, Instance

PROBE_CHUNK = 3
LENGTH = 8


class Seen(str, Enum):
    """What the rows of an always-causal module see, measured."""

    CHUNKS = "chunks"        # C * (t // C) .. t for the chunk probed
    CAUSAL = "causal"        # every earlier position: no structure the argument sets
    OTHER = "other"          # something else (a chunk off by one, a window, irregular)


def dependence(instance: Instance, case: Case, call: str) -> torch.Tensor:
    """(Lq, Lk) bool: whether output row t changes (in any batch element) when the inputs at
    position s alone, the query's included, are replaced by fresh noise."""
    inputs = case.inputs(call, use_mask=False)
    before = instance.forward(inputs)
    tolerance = unchanged_tolerance(before.dtype, before)
    seen = torch.zeros(case.q_len, case.kv_len, dtype=torch.bool)
    for position in range(case.kv_len):
        where = torch.zeros(case.batch, case.kv_len, dtype=torch.bool)
        where[:, position] = True
        after = instance.forward(case.replace_positions(inputs, where, stream=9, scale=3.0,
                                                        query_too=True))
        seen[:, position] = (abs_error(after, before) > tolerance).flatten(2).any(-1).any(0)
    return seen


def pattern(chunk: int | None, length: int = LENGTH, window: int | None = None) -> torch.Tensor:
    """(L, L) bool: the positions each causal row sees in chunks of ``chunk`` (None: none), or
    in a sliding ``window`` of that many keys."""
    return allowed_keys(1, length, length, None, True, chunk=chunk, window=window)[0, 0]


def window_of(seen: torch.Tensor) -> int | None:
    """The sliding window W (2 .. L - 1 keys per row, itself included) whose causal pattern
    ``seen`` (L, L) is, or None: a row that sees itself alone (W = 1) is no attention (an
    output that is its input), and is not read as a window."""
    length = seen.shape[0]
    for width in range(2, length):
        if torch.equal(seen, pattern(None, length, window=width)):
            return width
    return None


def chunk_of(seen: torch.Tensor) -> int | None:
    """The chunk C (2 .. L - 1) whose causal pattern ``seen`` (L, L) is, or None."""
    length = seen.shape[0]
    for chunk in range(2, length):
        if torch.equal(seen, pattern(chunk, length)):
            return chunk
    return None


def probe_chunk(build: Callable[[int], Instance], case: Case,
                call: str) -> tuple[Seen | None, torch.Tensor | None]:
    """(what the rows see, the (L, L) pattern) with the module built in chunks of
    PROBE_CHUNK; (None, None) when the build or a forward fails there."""
    try:
        seen = dependence(build(PROBE_CHUNK), case, call)
    except ImplementationError:
        return None, None
    if torch.equal(seen, pattern(PROBE_CHUNK, case.q_len)):
        return Seen.CHUNKS, seen
    if torch.equal(seen, pattern(None, case.q_len)):
        return Seen.CAUSAL, seen
    return Seen.OTHER, seen


def rows_words(seen: torch.Tensor) -> str:
    """Which positions each row sees, compactly: ``row 3 sees 2..3``, for the rows that do
    not see every earlier position."""
    parts = []
    for row in range(seen.shape[0]):
        positions = [int(p) for p in torch.nonzero(seen[row]).flatten()]
        if positions != list(range(row + 1)):
            span = (f"{positions[0]}..{positions[-1]}" if positions and
                    positions == list(range(positions[0], positions[-1] + 1)) else str(positions))
            parts.append(f"row {row} sees {span}")
    return ", ".join(parts) or "every row sees every earlier position"
