"""What is wrong with a forward's output, in the words a user needs: checked before anything reads
it (inference's first call, and every check's), in one place.

Attention's output is one floating-point tensor (batch, length, width) for inputs (batch,
length, d_model). The malformed outputs people return are recognisable: the per-head output
(batch, heads, length, head_dim) before the heads are merged, the attention weights (batch,
heads, q_len, kv_len), the output transposed to (length, batch, width) or pooled over the tokens
to (batch, width), a scalar, an integer tensor; each is named with what to do instead.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class OutputProblem(NamedTuple):
    """What is wrong (``reason``: the shape or dtype seen against the one expected) and, where
    the output is recognisable, what it looks like and what to do (``looks_like``)."""

    reason: str
    looks_like: str | None = None

    def __str__(self) -> str:
        return self.reason + (f": {self.looks_like}" if self.looks_like else "")


def output_problem(output: object, inputs: tuple[int, ...], *, heads: int | None = None,
                   width: int | None = None, kv_len: int | None = None) -> OutputProblem | None:
    """Why ``output`` is not attention's output for inputs of shape ``inputs`` (batch, length,
    d_model), or None where it is; ``width``: the last dimension it must have (None: any);
    ``heads``: the module's head count (to recognise per-head outputs); ``kv_len``: the keys'
    length (to recognise attention weights; default the length)."""
    batch, length, _ = inputs
    if not isinstance(output, torch.Tensor):
        return OutputProblem(f"forward returned {type(output).__name__}, not a tensor",
                             "return the attention output (batch, length, d_model)")
    shape = tuple(output.shape)
    expected = (batch, length, width if width is not None else "width")
    seen = f"output has shape {shape} for input {tuple(inputs)}"
    mismatch = (len(shape) != 3 or shape[:2] != (batch, length)
                or (width is not None and shape[2] != width))
    if mismatch:
        reason = f"{seen}, expected ({', '.join(map(str, expected))}) (batch, q_len, d_model)"
        return OutputProblem(reason, _looks_like(shape, batch, length, heads, width,
                                                 kv_len if kv_len is not None else length))
    if not (output.is_floating_point() or output.is_complex()):
        return OutputProblem(f"output dtype is {output.dtype}, not floating point",
                             "attention's output is floating point: is it rounded or cast "
                             "(.long(), .int()) on the way out?")
    return None


def _looks_like(shape: tuple[int, ...], batch: int, length: int, heads: int | None,
                width: int | None, keys: int) -> str | None:
    """What a mis-shaped output is, where its shape says, with what to do."""
    if not shape:
        return "a 0-dim tensor (a scalar): return the attention output, not a reduction of it"
    if len(shape) == 4 and shape[0] == batch and shape[2] == length:
        per_head = heads is not None and shape[1] == heads
        if shape[3] == keys and not (per_head and width is not None and heads * keys == width):
            return ("that looks like the attention weights (batch, heads, q_len, kv_len): apply "
                    "them to the values, merge the heads and apply the output projection")
        if per_head or heads is None:
            return ("that looks like the per-head output (batch, heads, length, head_dim): merge "
                    "the heads and apply the output projection")
    if len(shape) == 3 and batch != length and shape[:2] == (length, batch):
        return ("that looks like the output transposed to (length, batch, width): return it "
                "batch-first, as its input came")
    if len(shape) == 2 and shape[0] == batch:
        return ("that looks pooled over the tokens (batch, width): return one row per token, "
                "(batch, length, width)")
    return None
