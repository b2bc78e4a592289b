"""Known defects of the platform's own kernels, probed once per process.

A finding that only such a defect explains is the platform's, not the implementation's: the
suite reports it as a warning that names the defect, never as a failure.
"""

from __future__ import annotations

import os
from functools import cache

import torch

OVERRIDE = "ATTENTION_CONFORMANCE_PLATFORM_DEFECT"
"""An environment variable that fakes the probe: ``present`` or ``absent`` (anything else: the
probe decides). For testing the suite itself on both sides on any CPU (``make test`` must pass
on CPUs with and without the defect); it changes the suite's attribution, not torch's kernels."""

PLATFORM_NOTE = "on this platform"
"""Opens the summary of every finding attributed to a platform kernel (tests look for it)."""


@cache
def matmul_spreads_nan(dtype: torch.dtype, device: str = "cpu") -> bool:
    """Whether a NaN row of ``x`` makes another row of ``x @ w.T`` NaN in ``dtype``.

    Mathematically row i of the product depends on row i of x alone. torch 2.13's bfloat16
    matmul on CPUs with AMX/AVX512-BF16 pairs rows when the inner dimension is odd, so a NaN row
    (a fully masked row under the ``nan`` policy) reaches its neighbour. OVERRIDE fakes it.
    """
    faked = os.environ.get(OVERRIDE, "").strip().lower()
    if faked in ("present", "absent"):
        return faked == "present" and dtype in (torch.float16, torch.bfloat16)
    # The kernel is chosen by size: (64 x K) @ (K x 64) takes the defective path where it exists.
    for inner in (3, 5, 15):
        x = torch.ones(64, inner, dtype=dtype, device=device)
        x[33] = float("nan")
        product = x @ torch.ones(64, inner, dtype=dtype, device=device).T
        if int(torch.isnan(product).any(dim=-1).sum()) > 1:
            return True
    return False
