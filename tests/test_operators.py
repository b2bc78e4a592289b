"""Any attention operator judged by what it is (issue 65, ``tests/fixtures/operators.py``), nothing
declared: sigmoid attention, stick-breaking (with and without the current token), a top-k
indexer's selection, a hand-written zero-safe softmax, linear attention, a softcap, a
temperature, an encoder's window and a sink count each pass; each one-bug twin fails the check
named for its bug. The normaliser observed is said, and the checks
of softmax's own properties say what was observed instead of judging it."""

from __future__ import annotations

import pytest

from conformance import Status
from conformance.checks.diagnosis import Bug
from conformance.inference import infer
from conformance.model.normaliser import NormaliserKind
from conformance.model.remedies import texts
from conformance.model.results import Route
from conformance.run.many import check
from tests.fixtures import operators as ops

OBSERVED = {ops.SigmoidAttention: NormaliserKind.SIGMOID,
            ops.StickBreakingAttention: NormaliserKind.STICK_BREAKING,
            ops.StrictStickBreakingAttention: NormaliserKind.STICK_BREAKING,
            ops.TopKIndexerAttention: NormaliserKind.SELECTED,
            ops.ReLUAttention: NormaliserKind.RECTIFIED,
            ops.LinearAttention: NormaliserKind.LINEAR,
            ops.CausalLinearAttention: NormaliserKind.LINEAR}


@pytest.fixture(scope="module")
def checked():
    return {cls: check(cls, devices=["cpu"]) for cls in [*ops.CORRECT, *ops.BROKEN]}


@pytest.mark.parametrize("cls", ops.CORRECT, ids=lambda c: c.__name__)
def test_each_correct_operator_passes_bare(checked, cls):
    results = checked[cls]
    assert not [r for r in results if r.status in (Status.FAILED, Status.SUITE_ERROR)], [
        (r.check, r.reason) for r in results if r.status in (Status.FAILED, Status.SUITE_ERROR)]
    judged = {r.check for r in results if r.status is Status.PASSED}
    assert {"padding", "batch_independence", "autograd"} <= judged


@pytest.mark.parametrize("cls", list(ops.BROKEN), ids=lambda c: c.__name__)
def test_each_twin_fails_the_check_named_for_its_bug(checked, cls):
    named = next(r for r in checked[cls] if r.check == ops.BROKEN[cls])
    assert named.status is Status.FAILED, (named.status, named.reason)


def test_a_leak_through_the_stick_or_the_slots_is_named():
    for cls in (ops.StickBreakingWrongRange, ops.TopKFutureSlots):
        (causal,) = check(cls, devices=["cpu"], checks=["causal"])
        assert causal.status is Status.FAILED and causal.bug == Bug.LEAK_AROUND_WEIGHTS.value, (
            cls.__name__, causal.bug)


@pytest.mark.parametrize("cls", list(OBSERVED), ids=lambda c: c.__name__)
def test_the_normaliser_is_observed_and_said(cls):
    inferred = infer(cls)
    encoding = inferred.implementation.capabilities.position.encoding
    assert encoding.normaliser.kind is OBSERVED[cls]
    assert any(note.startswith("normaliser: ") for note in texts(inferred.notes))


def test_softmax_properties_say_what_was_observed_instead(checked):
    by_check = {r.check: r for r in checked[ops.SigmoidAttention]}
    for name in ("row_stochastic", "scale", "stability"):
        assert by_check[name].status is Status.SKIPPED
        assert by_check[name].reason.startswith("its weights are sigmoid(q·k/sqrt(d) - log n)")
    assert by_check["reference"].status is Status.PASSED  # the observed map, in float64


def test_a_textbook_softmax_layer_observes_no_normaliser():
    encoding = infer(ops.ZeroSafeSoftmaxAttention).implementation.capabilities.position.encoding
    assert encoding is None or encoding.normaliser is None


def test_a_softcap_setting_is_varied_and_an_ignored_one_named():
    assert any(note.startswith("softcap: a logit softcap setting")
               for note in texts(infer(ops.SoftcapAttention).notes))
    (configuration,) = check(ops.SoftcapNeverApplied, devices=["cpu"], checks=["configuration"])
    assert configuration.status is Status.FAILED
    assert "the configured value is ignored" in configuration.reason


def test_a_hand_written_softmax_is_a_core_the_checks_judge_through():
    results = check(ops.ZeroSafeEinsumAttention, devices=["cpu"],
                    checks=["row_stochastic", "reference", "scale"])
    assert all(r.status is Status.PASSED and r.route is Route.CORE for r in results), [
        (r.check, r.status, r.reason) for r in results]
    (scale,) = check(ops.ZeroSafeEinsumWrongScale, devices=["cpu"], checks=["scale"])
    assert scale.status is Status.FAILED and "hand-written softmax" in scale.reason


def test_a_finite_fill_bounds_the_logits_stability_generates():
    (stability,) = check(ops.FiniteFillAttention, devices=["cpu"], checks=["stability"])
    assert stability.status is Status.PASSED, stability.reason
    assert any("half the finite fill -10000" in note for note in stability.observations)


def test_a_softmax_gone_wrong_is_never_excused_as_another_normaliser():
    encoding = infer(ops.DropoutLeftOn).implementation.capabilities.position.encoding
    assert encoding is None or encoding.normaliser is None
    (rows,) = check(ops.DropoutLeftOn, devices=["cpu"], checks=["row_stochastic"])
    assert rows.status is Status.FAILED, rows.reason


@pytest.mark.parametrize("cls", [ops.TemperatureIgnored, ops.LocalWindowNeverApplied],
                         ids=lambda c: c.__name__)
def test_a_setting_that_changes_nothing_fails_configuration_named(cls):
    (configuration,) = check(cls, devices=["cpu"], checks=["configuration"])
    assert configuration.status is Status.FAILED
    assert "its outputs are identical, bit for bit" in configuration.reason
    assert "changes nothing it computes" in configuration.reason


def test_a_sink_count_a_full_forward_never_reads_is_a_warning():
    (configuration,) = check(ops.SinksOnlyInCache, devices=["cpu"], checks=["configuration"])
    assert configuration.status is Status.WARNED
    assert "the sink count changes nothing" in configuration.reason


def test_a_setting_switched_off_by_default_is_not_varied():
    class QwenStyle(ops.LocalEncoderAttention):
        def __init__(self, d_model, num_heads, sliding_window=4096, use_sliding_window=False):
            super().__init__(d_model, num_heads, window_size=sliding_window)

    notes = texts(infer(QwenStyle).notes)
    assert any("use_sliding_window is off by default, so it is not varied" in n for n in notes)
    assert infer(QwenStyle).implementation.capabilities.configured == ()
