"""A logit scale the layer's design sets is measured and explained before it is judged (issue 53,
step 2): a constructor setting it follows is its scale and is built with another value; one
whose name says it is the scale and that is ignored fails; 1/w warns (muP's design, or
1/sqrt(w) twice) unless declared; a learned temperature is described."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conformance import Status
from conformance.checks.invariants.scale import INVERSE_WIDTH
from conformance.inference import Declarations, infer
from conformance.model.forms import LogitScale, PositionEncoding, ScaleRelation
from conformance.model.remedies import texts
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import reference_attention
from conformance.run.many import check_many
from tests.fixtures import new_architectures as arch
from tests.fixtures import new_designs as designs


class InverseWidth(nn.Module):
    """Self-attention scaled by 1/head_dim, fixed (muP's parametrisation), not causal."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.heads = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1], dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(batch, length, width))


def scale_of(cls: type, **declared: str) -> LogitScale | None:
    encoding = infer(cls, declared=Declarations(**declared)).implementation.capabilities.position.encoding
    return None if encoding is None else encoding.scale


def test_a_law_is_the_scale_at_each_width_and_said_in_words():
    assert LogitScale(power=-1.0).at(4) == 0.25
    assert LogitScale().textbook and LogitScale().law() == "1/sqrt(w)"
    assert LogitScale(0.5, 0.0).law() == "0.5"
    assert ScaleRelation.INVERSE_SQRT.scale(4.0) == 0.5


def test_the_reference_computes_with_the_layers_own_scale():
    generator = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    weights = HeadWeights(r(2, 4, 8), r(2, 4), r(2, 4, 8), r(2, 4), r(2, 4, 8), r(2, 4))
    x = r(1, 5, 8)
    own = reference_attention(weights, x, x, x, encoding=PositionEncoding(
        scale=LogitScale(power=-1.0)))
    explicit = reference_attention(weights, x, x, x, scale=0.25)
    torch.testing.assert_close(own.output, explicit.output)


def test_a_setting_the_scale_follows_is_its_scale():
    scale = scale_of(designs.SettingScaledAttention)
    assert scale == LogitScale(1.0, -1.0, "attention_multiplier", ScaleRelation.MULTIPLIER)
    gemma = scale_of(arch.SoftcapAttention)
    assert gemma.argument == "query_pre_attn_scalar"
    assert gemma.relation is ScaleRelation.INVERSE_SQRT and gemma.textbook


def test_a_setting_named_for_the_scale_and_ignored_is_recorded_so():
    scale = scale_of(designs.MultiplierIgnored)
    assert scale.argument == "attention_multiplier" and not scale.followed and scale.textbook
    notes = texts(infer(designs.MultiplierIgnored).notes)
    assert any("by its name the logit scale's setting" in note for note in notes)


def test_one_over_the_width_fixed_is_measured_and_a_declaration_states_it():
    assert scale_of(InverseWidth) == LogitScale(1.0, -1.0)
    assert scale_of(InverseWidth, scale="sqrt") == LogitScale(power=-0.5, declared=True)


@pytest.fixture(scope="module")
def verdicts():
    targets = [(f"tests.test_logit_scale:{name}", infer(cls, declared=Declarations(**declared),
                                                        name=name).implementation)
               for name, cls, declared in (
                   ("InverseWidth", InverseWidth, {}),
                   ("InverseWidthDeclaredSqrt", InverseWidth, {"scale": "sqrt"}),
                   ("InverseWidthDeclared", InverseWidth, {"scale": "head_dim"}),
                   ("SettingScaledAttention", designs.SettingScaledAttention, {}),
                   ("MultiplierIgnored", designs.MultiplierIgnored, {}),
                   ("LearnedTemperatureAttention", designs.LearnedTemperatureAttention, {}))]
    results = check_many(targets, devices=["cpu"], checks=("scale", "reference", "head_split"))
    return {(r.implementation, r.check): r for r in results}


def test_one_over_the_width_warns_naming_both_readings(verdicts):
    result = verdicts["InverseWidth", "scale"]
    assert result.status is Status.WARNED and result.hint == INVERSE_WIDTH
    assert verdicts["InverseWidth", "reference"].status is Status.PASSED


def test_a_declared_scale_makes_another_one_a_failure(verdicts):
    assert verdicts["InverseWidthDeclaredSqrt", "scale"].status is Status.FAILED
    assert verdicts["InverseWidthDeclared", "scale"].status is Status.PASSED


def test_a_followed_setting_passes_and_an_ignored_one_fails_scale(verdicts):
    assert verdicts["SettingScaledAttention", "scale"].status is Status.PASSED
    assert verdicts["SettingScaledAttention", "reference"].status is Status.PASSED
    ignored = verdicts["MultiplierIgnored", "scale"]
    assert ignored.status is Status.FAILED
    assert "attention_multiplier is ignored" in ignored.reason


def test_a_learned_temperature_is_described_not_failed(verdicts):
    result = verdicts["LearnedTemperatureAttention", "scale"]
    assert result.status is Status.PASSED
    assert any("a learned temperature" in note for note in result.observations)


def test_a_one_wide_head_broadcast_by_its_rope_is_read_at_its_own_width():
    """HuggingFace's RoPE at head width 1 broadcasts q and k to two equal columns: the core's
    q·kᵀ contracts 2, the layer scales by 1/sqrt(1), and the core route reads that width too
    (issue 55: the weights route and the core route agree)."""
    pytest.importorskip("transformers")
    from conformance.generation.cases import Case
    from conformance.loading.registry import resolve

    spec = "tests.fixtures.library_transformers:Qwen3QKNormAttention"
    case = Case(batch=1, q_len=2, kv_len=2, num_heads=2, head_dim=1, seed=0, causal=True,
                kv_heads=1)
    (result,) = check_many([(spec, resolve(spec)[0])], devices=["cpu"], checks=("scale",),
                           replay=case)
    assert result.route.value == "core" and result.status is Status.PASSED, result.reason
