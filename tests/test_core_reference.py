"""The reference through the core (issue 53, step 4): where no weight layout maps a layer, each
attention core its forward computes is held to the float64 softmax of its own logits with the
keys attention hides masked (tests/fixtures/new_architectures.py: each proved by its own
float64 oracle)."""

from __future__ import annotations

import pytest

from conformance import Status
from conformance.checks.invariants.core_reference import LEAKS, MASKED_AFTER
from conformance.loading.registry import resolve
from conformance.model.results import Route
from conformance.run.many import check_many

CORRECT = ("MultiHeadLatentAttention", "T5Attention", "T5DecoderSelfAttention",
           "DifferentialAttention", "PerceiverLatentAttention")
TWINS = {"T5MaskAfterSoftmax": MASKED_AFTER, "PerceiverMaskIgnored": LEAKS,
         "T5DecoderCausalDroppedWithMask": LEAKS}


@pytest.fixture(scope="module")
def verdicts():
    specs = [f"tests.fixtures.new_architectures:{name}" for name in (*CORRECT, *TWINS)]
    results = check_many([(spec, resolve(spec)[0]) for spec in specs], devices=["cpu"],
                         checks=("reference",), jobs=2)
    return {r.implementation.split(":")[-1]: r for r in results}


@pytest.mark.parametrize("name", CORRECT)
def test_a_correct_core_agrees_with_the_softmax_of_its_own_logits(verdicts, name):
    result = verdicts[name]
    assert result.route is Route.CORE and result.status is Status.PASSED, result.reason


@pytest.mark.parametrize("name", list(TWINS))
def test_a_mask_mistake_at_the_core_fails_the_reference_named(verdicts, name):
    result = verdicts[name]
    assert result.route is Route.CORE and result.status is Status.FAILED
    assert "gives the keys attention hides from it" in result.reason
    assert result.hint == TWINS[name]


def test_an_input_the_forward_ignores_at_width_one_has_its_zero_derivative():
    """Perceiver's LayerNorm over a context one feature wide makes every token the same: no
    gradient reaches the keys because the output does not depend on them, and that zero is the
    derivative, not a detached graph (a thorough-profile false alarm, seed 1)."""
    from conformance.generation.cases import Case

    spec = "tests.fixtures.new_architectures:PerceiverLatentAttention"
    case = Case(batch=1, q_len=4, kv_len=3, num_heads=1, head_dim=1, seed=0, kept=(2,))
    (result,) = check_many([(spec, resolve(spec)[0])], devices=["cpu"], checks=("autograd",),
                           replay=case)
    assert result.status is Status.PASSED, result.reason
    assert any("its zero gradient is its derivative" in note for note in result.observations)
