"""The platform-defect path on both sides, on any CPU: the probe of torch's bfloat16 matmul
(:func:`conformance.numerics.platform_defects.matmul_spreads_nan`) faked present and absent, over
a module that carries a NaN row into its neighbour in bfloat16 the way the defective matmul does
(and is clean in float32). Present, the finding is the platform's (a warning that names it);
absent, it is the module's (a failure). Whichever CPU runs the suite, both are proved."""

from __future__ import annotations

import pytest
import torch

from conformance import Dtypes, Status, check
from conformance.checks.invariants import platform
from conformance.implementations.mutants.textbook import TextbookAttention, declare
from conformance.numerics.platform_defects import PLATFORM_NOTE


class SpreadsNaNInBFloat16(TextbookAttention):
    """Correct attention whose output projection, in bfloat16 only, carries a NaN row into the
    row after it, as torch 2.13's bfloat16 matmul does on CPUs with AMX/AVX512-BF16."""

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        out = super().finish(x)
        if out.dtype is not torch.bfloat16:
            return out
        rows = out.reshape(-1, out.shape[-1])
        nan = torch.isnan(rows).any(-1)
        spread = torch.cat([nan.new_zeros(1), nan[:-1]])
        return torch.where(spread[:, None], float("nan"), rows).reshape(out.shape)


IMPLEMENTATION = declare("spreads-nan-in-bfloat16", SpreadsNaNInBFloat16,
                         description="a bfloat16 NaN spread as the platform's defect spreads it",
                         floats=Dtypes((torch.float32, torch.bfloat16)))
REPLAY = ("Case(batch=2, q_len=3, kv_len=3, num_heads=1, head_dim=4, dtype='bfloat16', seed=0, "
          "kept=(0, 3))")
"""Batch element 0 fully masked (NaN rows under the nan policy), element 1 not: its first row
follows element 0's last in the flattened rows, so the spread reaches it."""


@pytest.mark.parametrize("present", [True, False], ids=["defect-present", "defect-absent"])
def test_a_spread_nan_is_the_platforms_only_where_the_probe_finds_the_defect(monkeypatch,
                                                                              present):
    monkeypatch.setattr(platform, "matmul_spreads_nan", lambda dtype, device="cpu": present)
    (result,) = check(IMPLEMENTATION, devices=["cpu"], checks=["fully_masked"], replay=REPLAY)
    if present:
        assert result.status is Status.WARNED
        assert result.reason.startswith(f"{PLATFORM_NOTE}, in bfloat16 only")
    else:
        assert result.status is Status.FAILED
        assert result.reason.startswith("output row 0 of batch 1 is NaN, though the row has keys")


def test_the_real_probe_answers_on_this_cpu():
    """Whatever it answers here (the tests above hold either way), it answers a bool."""
    from conformance.numerics.platform_defects import matmul_spreads_nan

    assert matmul_spreads_nan(torch.bfloat16) in (True, False)
    assert matmul_spreads_nan(torch.float32) is False


@pytest.mark.parametrize("faked", ["present", "absent"])
def test_the_environment_fakes_the_probe_for_a_whole_run(monkeypatch, faked):
    """``ATTENTION_CONFORMANCE_PLATFORM_DEFECT`` fakes the probe in every process of a run (the
    command line's, pytest's spawned ones), so ``make test`` can be run on both sides."""
    from conformance.numerics import platform_defects

    monkeypatch.setenv(platform_defects.OVERRIDE, faked)
    platform_defects.matmul_spreads_nan.cache_clear()
    try:
        assert platform_defects.matmul_spreads_nan(torch.bfloat16) is (faked == "present")
        assert platform_defects.matmul_spreads_nan(torch.float32) is False
    finally:
        platform_defects.matmul_spreads_nan.cache_clear()
