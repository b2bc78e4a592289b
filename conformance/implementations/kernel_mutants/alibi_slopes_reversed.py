"""Kernel mutant: ALiBi slopes read back to front.

Bug: head h's bias uses the slope of head H - 1 - h (the slopes tensor indexed from the wrong
end, as a kernel walking heads in reverse order does). Symptom: exact without ``alibi_slopes``
and with one head; with several heads each gets another head's distance penalty. Caught by:
``kernel`` (the paper's slopes given through ``alibi_slopes``).
"""

from __future__ import annotations

from dataclasses import replace

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "kernel"
EXPOSED_BY = {"alibi_slopes": [0.5, 0.25]}
"""The arguments under which it differs from the correct kernel (as a list: made a tensor)."""


class AlibiSlopesReversed(Kernel):
    def bias(self, q_len, start, stop, kv_len, options, device):
        if options.alibi is None:
            return 0.0
        return super().bias(q_len, start, stop, kv_len,
                            replace(options, alibi=options.alibi.flip(0)), device)


KERNEL = kernel_function(AlibiSlopesReversed(), "bhld", "alibi_slopes_reversed")
