"""No check judges a padded query row, and the quick profile always tries the case that shows a
padding mask applied on the query axis (issue 53, step 6; tests/fixtures/padded_rows.py)."""

from __future__ import annotations

import pytest

from conformance import Status
from conformance.checks.invariants.padding import revealing_masks
from conformance.inference import infer
from conformance.run.many import check_many
from tests.fixtures import padded_rows as rows

CHECKS = ("padding", "causal", "autograd", "reference", "fully_masked")


@pytest.fixture(scope="module")
def verdicts():
    targets = [(f"tests.fixtures.padded_rows:{cls.__name__}", infer(cls).implementation)
               for cls in (rows.NaNOnEmptyRows, rows.MaskOnQueryAxis)]
    results = check_many(targets, devices=["cpu"], checks=CHECKS)
    return {(r.implementation.split(":")[-1], r.check): r for r in results}


def test_the_revealing_case_has_a_masked_key_before_a_kept_one():
    caps = infer(rows.NaNOnEmptyRows).implementation.capabilities
    (case,) = revealing_masks(caps, "cpu")
    for keep in case.keep():
        kept = keep.nonzero().flatten().tolist()
        assert kept[0] == 0 and any(not keep[p] for p in range(kept[-1]))


def test_nan_in_rows_attention_leaves_unspecified_fails_nothing(verdicts):
    failed = {check: verdicts["NaNOnEmptyRows", check].reason for check in CHECKS
              if verdicts["NaNOnEmptyRows", check].status is Status.FAILED}
    assert not failed


def test_a_mask_on_the_query_axis_fails_padding_in_the_quick_profile(verdicts):
    result = verdicts["MaskOnQueryAxis", "padding"]
    assert result.status is Status.FAILED
    assert "changing key/value inputs at masked positions" in result.reason
