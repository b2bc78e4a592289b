"""Mutant: ALiBi slopes assigned to the heads in reverse order.

Bug: the geometric slopes listed from the smallest (``2 ** (-8 * h / H)`` counted down, or the
list reversed when padding a non-power-of-two head count): head 0 gets the gentlest slope instead
of the steepest. Each head still has a valid linear bias, so the model trains, but a checkpoint
trained with the paper's slopes behaves differently. Symptom: the measured per-head slopes are
the paper's, back to front. Caught by: ``alibi``.
"""

from __future__ import annotations

from conformance.implementations.modern import AlibiAttention
from conformance.implementations.modern_declared import declare_alibi

CATCHES = "alibi"


class AlibiSlopesReversed(AlibiAttention):
    def head_slopes(self, num_heads):
        return super().head_slopes(num_heads)[::-1]


IMPLEMENTATION = declare_alibi("mutant-alibi-slopes-reversed", AlibiSlopesReversed,
                               description="ALiBi slopes in reverse head order")
