"""Causal by structure (``tests/fixtures/structural_leaks.py``): a layer whose attention weights on
every later key are exactly 0 (observed at its core) is checked as causal with nothing declared,
so a future that leaks around those weights (a gate over every position, a convolution over the
logits before the mask) fails ``causal``, named as such; the correct forms pass."""

from __future__ import annotations

import pytest

from conformance import Status
from conformance.checks.diagnosis import Bug
from conformance.inference import infer
from conformance.model.remedies import texts
from conformance.run.many import check
from tests.fixtures import structural_leaks as leaks


@pytest.mark.parametrize("cls", leaks.CORRECT, ids=lambda c: c.__name__)
def test_a_causal_layer_with_a_gate_or_a_convolution_of_its_own_passes(cls):
    results = check(cls, devices=["cpu"])
    assert not [r for r in results if r.status in (Status.FAILED, Status.SUITE_ERROR)]
    assert next(r for r in results if r.check == "causal").status is Status.PASSED


@pytest.mark.parametrize("cls", list(leaks.BROKEN), ids=lambda c: c.__name__)
def test_a_leak_around_causal_weights_fails_causal_named_for_it(cls):
    assert any(note.startswith("causal by structure") for note in texts(infer(cls).notes))
    (causal,) = check(cls, devices=["cpu"], checks=["causal"])
    assert causal.status is Status.FAILED, causal
    assert causal.bug == Bug.LEAK_AROUND_WEIGHTS.value, causal.hint
