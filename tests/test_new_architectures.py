"""What the suite makes of the new architectures (``tests/fixtures/new_architectures.py``, each
proved by its own float64 oracle in ``tests/test_new_architectures_are_correct.py``), with
nothing declared: every correct one checked without a failure, the layers no weight layout maps
judged through their attention core, and every broken twin failing the check named for its bug
(a warning where its bug shows in a dtype nobody declared)."""

from __future__ import annotations

import pytest
import torch

from conformance import Status
from conformance.loading.registry import resolve
from conformance.model.check_names import THROUGH_THE_CORE
from conformance.model.results import Route
from conformance.run.many import check_many
from tests.fixtures import new_architectures as arch

CHECKED = [*arch.CORRECT, *arch.BROKEN, *arch.KERNELS]


def spec(cls: type) -> str:
    return f"tests.fixtures.new_architectures:{cls.__name__}"


@pytest.fixture(scope="module")
def checked():
    targets = [(spec(cls), resolve(spec(cls))[0]) for cls in CHECKED]
    results = check_many(targets, devices=["cpu"], jobs=2)
    by_name: dict[str, dict] = {}
    for result in results:
        by_name.setdefault(result.implementation.split(":")[-1], {})[result.check] = result
    return by_name


@pytest.mark.parametrize("cls", [*arch.CORRECT, arch.softcap_kernel], ids=lambda c: c.__name__)
def test_no_correct_layer_fails(checked, cls):
    results = checked[cls.__name__]
    failed = {name: r.reason for name, r in results.items()
              if r.status in (Status.FAILED, Status.SUITE_ERROR)}
    assert not failed
    assert sum(r.status is Status.PASSED for r in results.values()) >= 8


TWINS = {**arch.BROKEN, **{f: check for f, check in arch.KERNELS.items() if check}}


@pytest.mark.parametrize(("cls", "check"), list(TWINS.items()),
                         ids=lambda v: getattr(v, "__name__", v))
def test_each_twin_fails_the_check_named_for_its_bug(checked, cls, check):
    result = checked[cls.__name__][check]
    assert result.status in (Status.FAILED, Status.WARNED), result
    if result.status is Status.WARNED:
        assert "assumed rather than declared" in result.reason  # a dtype nobody declared


@pytest.mark.parametrize("name", ["MultiHeadLatentAttention", "MultiHeadLatentAttentionAbsorbed",
                                  "DifferentialAttention", "T5Attention",
                                  "PerceiverLatentAttention"])
def test_a_layer_no_weight_layout_maps_is_judged_through_its_core(checked, name):
    routed = {check for check, r in checked[name].items() if r.route is Route.CORE}
    assert routed == set(THROUGH_THE_CORE)  # what inference's note says
    for check in THROUGH_THE_CORE:
        assert checked[name][check].status in (Status.PASSED, Status.WARNED)


def test_t5_no_scaling_beside_its_bias_is_a_warning_and_its_positions_are_measured(checked):
    scale = checked["T5Attention"]["scale"]
    assert scale.status is Status.WARNED and "T5's convention" in scale.hint
    permutation = checked["T5Attention"]["permutation"]
    assert permutation.status is Status.SKIPPED and "measured: relative" in permutation.reason
    assert checked["T5Attention"]["position_shift"].status is Status.PASSED  # j - i alone


def test_the_hints_name_the_mistakes(checked):
    assert "rotary" in checked["MLAScaleNopeOnly"]["scale"].hint
    assert "split into the 2 maps" in checked["DifferentialScaleFullWidth"]["scale"].hint
    assert "after the softmax" in checked["T5MaskAfterSoftmax"]["row_stochastic"].hint
    assert "padding mask undoes" in checked["T5DecoderCausalDroppedWithMask"]["causal"].hint
    assert "from the cache" in checked["CrossAttentionCacheIgnoresMask"]["kv_cache"].hint
    assert "positions" in checked["RopeBf16Positions"]["low_precision"].hint
    assert ("sm_scale is ignored when logit_softcap is given"
            in checked["softcap_kernel_scale_dropped"]["kernel"].hint)


def test_queries_of_its_own_are_found_and_only_the_keys_are_generated(checked):
    (implementation,) = resolve(spec(arch.PerceiverLatentAttention))
    caps, notes = implementation.capabilities, implementation.notes
    assert (caps.call, caps.queries, caps.causality.kind) == ("latent", 4, "never")
    assert caps.mask is not None and implementation.weight_layout is None
    assert any("its queries are its own: 4 output rows" in str(note) for note in notes)
    results = checked["PerceiverLatentAttention"]
    assert results["permutation"].status is Status.PASSED  # the keys moved, not the latents
    assert results["causal"].reason == "inferred: non-causal attention"


def test_declaring_latent_for_a_layer_whose_queries_are_its_tokens_is_one_line():
    from conformance import infer
    from conformance.inference.plan import InferenceError
    from conformance.model.declaration_sources import from_mapping

    with pytest.raises(InferenceError, match="call=latent is declared, but its output has a row "
                                             "per token"):
        infer(arch.T5Attention, declared=from_mapping({"call": "latent"}, "test"))


def test_what_inference_found_missing_is_said_as_inferred_not_declared(checked):
    assert checked["T5Attention"]["kv_cache"].reason == "inferred: no KV cache"
    assert checked["T5Attention"]["causal"].reason == "inferred: non-causal attention"


def test_a_layer_without_weights_is_drawn_from_its_core():
    from conformance.checks.picture import picture
    from conformance.generation.cases import Case
    from conformance.subject.in_process import InProcessSubject

    impl = resolve(spec(arch.T5MaskAfterSoftmax))[0]
    case = Case(batch=1, q_len=4, kv_len=4, num_heads=2, head_dim=2, dtype="float32", kept=(2,))
    drawn = picture(InProcessSubject(impl), impl.capabilities, case, "row 0 sums to 0.53")
    assert drawn.unavailable is None and "attention core" in drawn.where
    assert all(abs(sum(row) - 1) <= 1e-6 for row in drawn.reference)
    assert any(abs(sum(row) - 1) > 1e-3 for row in drawn.measured)  # the mask after softmax


class _NeedsItsCache(torch.nn.Module):
    """Its plain call fails: it indexes the cache it is given."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(d_model, num_heads, batch_first=True)

    def forward(self, x, past_key_value=None, use_cache=False):
        keys = torch.cat([past_key_value[0], x], 1)
        return self.mha(x, keys, keys)[0]


def test_an_unprobed_causality_is_never_stated_as_not_causal():
    from conformance import infer

    said = [str(note) for note in infer(_NeedsItsCache).notes]
    assert any("causality not probed" in note for note in said)
    assert any("its causality could not be probed" in note for note in said)
    assert not any("the module is not causal" in note for note in said)


def test_an_instance_through_the_python_api_is_judged_at_its_core_too():
    from conformance import check

    torch.manual_seed(0)
    (result,) = check(arch.MLAScaleNopeOnly(16, 4), checks=["scale"])
    assert result.status is Status.FAILED and result.route is Route.CORE
