"""The runner: verdicts, skips, the gate's blocking, expected failures, misbehaving code."""

from __future__ import annotations

import torch

import conformance
from conformance import Status
from conformance.generation.cases import Case
from conformance.inference.observing.attention_probe import measure_attention
from conformance.numerics.reference import reference_attention
from tests.fixtures import user_impls


def by_check(results):
    return {r.check: r for r in results}


def test_a_correct_user_implementation_passes_everything_it_can_take():
    results = by_check(conformance.check(user_impls.plain, devices=["cpu"]))
    assert set(results) == set(conformance.CHECK_NAMES)
    skipped = {c: r.reason for c, r in results.items() if r.status is Status.SKIPPED}
    assert skipped == {
        "causal": "declares non-causal attention",
        "mask_formats": "declares one mask format",
        "low_precision": "declares no float16 or bfloat16",
        "dropout": "declares no dropout",
        # The modern forms it doesn't declare, each skipped with its reason.
        "kv_groups": "declares no grouped key/value heads",
        "position_shift": "declares no relative position encoding (RoPE, ALiBi)",
        "alibi": "declares no ALiBi position bias",
        "sliding_window": "declares no sliding window",
        "chunked": "declares no causal chunks",
        "kv_cache": "declares no KV cache",
        "packed": "declares no packed sequences (cu_seqlens or a block-diagonal mask)",
        "configuration": "declares no constructor setting to vary (a RoPE theta or rotated "
                         "share, a softcap, a temperature, a window, a sink count)",
        "kernel": "not a kernel function",
    }
    assert all(r.status is Status.PASSED for c, r in results.items() if c not in skipped)
    assert "rows with every key masked give NaN" in results["fully_masked"].observations


def test_a_wrong_scale_fails_head_split_with_numbers_location_and_case():
    result = by_check(conformance.check(user_impls.wrong_scale, devices=["cpu"],
                                        checks=["gate", "head_split"]))["head_split"]
    assert result.status is Status.FAILED
    assert "differs from the concatenated per-head attentions" in result.reason
    assert "at batch" in result.reason and "row" in result.reason
    case = eval(result.counterexample, {"Case": Case})
    assert case.num_heads >= 2


def test_expected_failures_are_reported_as_such_and_an_unexpected_pass_fails():
    failing = by_check(conformance.check(user_impls.wrong_scale_expected,
                                         checks=["gate", "head_split"]))
    assert failing["head_split"].status is Status.EXPECTED_FAILURE
    assert "expected: divides by sqrt(d_model)" in failing["head_split"].details
    passing = by_check(conformance.check(user_impls.plain_expected_to_fail,
                                         checks=["gate", "padding"]))
    assert passing["padding"].status is Status.FAILED
    assert passing["padding"].reason.startswith("expected to fail")


def test_forward_that_raises_fails_the_gate_once_and_blocks_the_rest():
    results = by_check(conformance.check(user_impls.raises, devices=["cpu"]))
    assert results["gate"].status is Status.FAILED
    assert "RuntimeError: kaboom in forward" in results["gate"].reason
    for name in set(conformance.CHECK_NAMES) - {"gate"}:
        assert results[name].status is Status.SKIPPED
        assert results[name].reason.startswith("blocked: the gate failed")


def test_non_tensor_and_wrong_shape_outputs_fail_the_gate_with_what_was_seen():
    gate = by_check(conformance.check(user_impls.returns_tuple, checks=["gate"]))["gate"]
    assert "returned tuple, not a tensor" in gate.reason
    gate = by_check(conformance.check(user_impls.wrong_shape, checks=["gate"]))["gate"]
    assert "output has shape (2, 1, 8) for input (2, 5, 8), expected (2, 5, 8)" in gate.reason


def test_a_broken_declared_feature_is_reported_once_by_its_owner_and_dropped():
    results = by_check(conformance.check(user_impls.raises_on_mask,
                                         checks=["gate", "contract", "padding", "head_split"]))
    assert results["gate"].status is Status.PASSED
    assert "the other checks run without it" in results["gate"].observations[0]
    assert results["contract"].status is Status.FAILED
    assert results["contract"].reason.startswith("declared mask")
    assert "ValueError: masks are not supported after all" in results["contract"].reason
    assert results["padding"].status is Status.SKIPPED
    assert "failed at the gate; see contract" in results["padding"].reason
    assert results["head_split"].status is Status.PASSED


def test_absent_devices_skip_cleanly():
    if torch.cuda.is_available():
        return
    results = conformance.check(user_impls.plain, devices=["cuda"])
    assert {r.status for r in results} == {Status.SKIPPED}
    assert results[0].reason == "cuda is not available on this machine"


def test_quick_profile_is_deterministic():
    checks = ["gate", "padding", "head_split", "scale"]
    first = [r.to_dict() for r in conformance.check("mutant-heads-view-no-transpose", checks=checks)]
    second = [r.to_dict() for r in conformance.check("mutant-heads-view-no-transpose",
                                                     checks=checks)]
    for result in (*first, *second):
        result.pop("seconds")
    assert first == second


def test_probe_measures_the_attention_matrix_an_implementation_computes():
    subject = conformance.run.runner.as_subject("reference-sdpa")
    case = Case(batch=2, q_len=3, kv_len=4, num_heads=2, head_dim=5, seed=1, kept=(4, 2))
    instance = subject.instantiate(case.config, case.seed)
    attention = measure_attention(instance, case, "qkv", keep=case.keep())
    # The probe loaded its own weights; the reference with those weights must agree.
    weights = instance.read_weights()
    g = torch.Generator().manual_seed(0)
    assert attention.shape == (2, 2, 3, 4)
    assert torch.all(attention[1, :, :, 2:] == 0)
    torch.testing.assert_close(attention.sum(-1), torch.ones(2, 2, 3, dtype=torch.float64))
    x = torch.randn(2, 4, 10, generator=g)
    expected = reference_attention(weights, x[:, :3], x, x, keep=case.keep()).output
    torch.testing.assert_close(instance.forward(
        conformance.Inputs(x[:, :3], x, x, case.keep())).double(), expected, rtol=1e-5, atol=1e-5)


def test_a_worker_resolves_only_the_kind_it_checks_and_each_once(monkeypatch):
    """A model resolves to each kind of attention layer in it, each inferred: a worker process
    asks for the one kind it checks (no other is inferred), once per kind and declarations."""
    from conformance.model.declarations import Declarations
    from conformance.run import many

    calls = []
    monkeypatch.setattr(many, "_RESOLVED", {})
    monkeypatch.setattr(many, "resolve",
                        lambda spec, declared, named: calls.append((spec, named)) or [named])
    bart = "transformers:BartModel"
    for _ in range(3):
        assert many._resolved(bart, None, f"{bart}:encoder") == [f"{bart}:encoder"]
    many._resolved(bart, None, f"{bart}:decoder")
    many._resolved(bart, Declarations(scale="none"), f"{bart}:encoder")
    assert calls == [(bart, f"{bart}:encoder"), (bart, f"{bart}:decoder"),
                     (bart, f"{bart}:encoder")]
