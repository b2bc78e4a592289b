"""The weights a causal structure gives at zero content logits, measured exactly: what
``sliding_window`` and ``chunked`` hold a layer's edges to.

At zero content logits every key a row sees gets exactly 1 / (how many it sees) and every other
key exactly 0, so a key one position off an edge can't hide behind an underflowed weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from conformance.checks.invariants.base import CheckContext
from conformance.generation.cases import Case
from conformance.inference.observing.attention_probe import measure_attention
from conformance.numerics.reference import allowed_keys
from conformance.numerics.tolerance import abs_error, eps, worst_index


@dataclass(frozen=True)
class EdgeGap:
    """The worst weight off the structure's: at (batch, head, row, key), measured against
    expected, and whether the structure lets the row see that key."""

    batch: int
    head: int
    row: int
    key: int
    measured: float
    expected: float
    inside: bool


def zero_logit_gap(context: CheckContext, case: Case) -> EdgeGap | None:
    """The worst weight of ``case``'s structure (causal, its window, its chunk) the layer's
    attention at zero content logits is off, beyond 4 (Lk + 2) eps of the dtype judged; None
    where none is."""
    attention = measure_attention(context.build(case), case, context.capabilities.call,
                                  causal=True, gain=0.0)
    visible = allowed_keys(case.batch, case.q_len, case.kv_len, None, True, window=case.window,
                           chunk=case.chunk).expand_as(attention)
    counts = visible.sum(dim=-1, keepdim=True).to(torch.float64)
    expected = torch.where(visible, 1.0 / counts, 0.0)
    diff = abs_error(attention, expected)
    if float(diff.max()) <= 4 * (case.kv_len + 2) * eps(context.judged(case.config.dtype)):
        return None
    b, h, row, key = worst_index(diff)
    return EdgeGap(b, h, row, key, float(attention[b, h, row, key]),
                   float(expected[b, h, row, key]), bool(visible[b, h, row, key]))
