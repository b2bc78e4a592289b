"""The agreement rule (conformance.numerics.tolerance): the max rule always, the mean rule where a mean
is a statistic."""

from __future__ import annotations

import subprocess
import sys

import torch

from conformance.numerics.tolerance import MEAN_MIN_ELEMENTS, agreement, worst_index


def test_a_few_elements_a_unit_off_are_judged_by_the_max_rule_alone():
    """Two float16 outputs one unit in the last place off, beside a baseline that happened to
    round exactly: a correct computation, which the mean of two elements would have failed."""
    reference = torch.tensor([[[1.0, 1.5]]], dtype=torch.float64)
    ulp = torch.finfo(torch.float16).eps
    actual = (reference + ulp).to(torch.float16)
    seen = agreement(actual, reference, reference.to(torch.float16), torch.float16)
    assert seen.ok, seen.describe()


def test_a_systematic_bias_under_the_max_rule_still_fails_on_enough_elements():
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(1, 8, MEAN_MIN_ELEMENTS // 8, dtype=torch.float64,
                            generator=generator)
    baseline = reference.to(torch.float16)
    biased = (reference + 1.5e-3).to(torch.float16)  # every element, under the max rule's floor
    seen = agreement(biased, reference, baseline, torch.float16)
    assert seen.max_error <= seen.allowed
    assert not seen.ok and "systematic bias" in seen.describe()


def test_the_worst_index_is_where_the_largest_entry_is():
    generator = torch.Generator().manual_seed(0)
    for shape in [(3,), (2, 5), (2, 3, 4), (1, 7, 1, 3)]:
        for _ in range(20):
            error = torch.rand(shape, generator=generator)
            index = worst_index(error)
            assert len(index) == len(shape) and error[index] == error.max()


def test_finding_the_worst_index_imports_no_sympy():
    """torch.unravel_index imports sympy (0.4 s) on its first call; an isolated check's checker
    needs nothing else of it."""
    code = ("import sys, torch; from conformance.numerics.tolerance import worst_index; "
            "worst_index(torch.rand(2, 3)); print('sympy' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
