"""Mutant: the ALiBi bias added with the wrong sign.

Bug: ``+m (i - j)`` instead of ``-m (i - j)``: distant keys are favoured instead of penalised
(the distance computed as j - i, or the minus sign dropped). Still a relative bias: shifting
positions and cached decoding are unaffected. Symptom: the measured slopes are negative.
Caught by: ``alibi``.
"""

from __future__ import annotations

from conformance.implementations.modern import AlibiAttention
from conformance.implementations.modern_declared import declare_alibi

CATCHES = "alibi"


class AlibiSign(AlibiAttention):
    def position_bias(self, q_len, kv_len, device, dtype):
        return -super().position_bias(q_len, kv_len, device, dtype)


IMPLEMENTATION = declare_alibi("mutant-alibi-sign", AlibiSign,
                               description="ALiBi bias +m (i - j): favours distant keys")
