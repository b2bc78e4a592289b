"""Kernel mutant: dV from the unnormalised probabilities.

Bug: dV = exp(S - rowmax)^T dO, the forward's tile of unnormalised exponentials reused, where
P = exp(S - lse) was meant (the division by the row's sum forgotten). Symptom: the forward, dQ
and dK are exact; dV is too large by each row's sum of exponentials. Caught by: ``reference``
(the value input's gradient).
"""

from __future__ import annotations

import torch

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "reference"


class DvUnnormalised(Kernel):
    def dv(self, p, dout, lse, s):
        unnormalised = torch.exp(s - s.amax(-1, keepdim=True).clamp_min(-1e30))
        return torch.nan_to_num(unnormalised).transpose(-1, -2) @ dout


KERNEL = kernel_function(DvUnnormalised(), "bhld", "dv_unnormalised")
