"""The normaliser observed (issue 65): the map from logits to weights fitted from measured
weights (``numerics.normaliser_fit``), applied by the float64 reference, and what it admits of
the checks; each operator of ``tests/fixtures/operators.py`` proved against its own float64
oracle here, so that a pass of the suite on it means something."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from conformance.checks.invariants.base import Structure, unmet
from conformance.model.forms import PositionEncoding
from conformance.model.normaliser import Normaliser, NormaliserKind
from conformance.model.spec import Capabilities
from conformance.numerics.normaliser_fit import fit_normaliser, laws
from tests.fixtures import operators as ops

LENGTH = 5


def _scores(seed: int = 0, length: int = LENGTH) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, 2, length, length, generator=generator, dtype=torch.float64) * 2


def _causal(length: int = LENGTH) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril()[None, None]


def test_a_softmax_over_the_keys_is_no_finding():
    scores = _scores()
    assert fit_normaliser(torch.softmax(scores * 0.5, -1), scores,
                          torch.ones(1, 1, LENGTH, LENGTH, dtype=torch.bool)) is None


def test_a_sigmoid_is_fitted_with_its_slope_and_bias():
    scores = _scores()
    everything = torch.ones(1, 1, LENGTH, LENGTH, dtype=torch.bool)
    found = fit_normaliser(torch.sigmoid(0.5 * scores - math.log(LENGTH)), scores, everything)
    assert found.kind is NormaliserKind.SIGMOID
    assert found.scale == pytest.approx(0.5) and found.bias == pytest.approx(-math.log(LENGTH))
    assert found.evidence.startswith("row ") and "sums to" in found.evidence


@pytest.mark.parametrize("current", [True, False])
def test_stick_breaking_is_fitted_with_or_without_the_current_token(current):
    scores = _scores(1)
    made = Normaliser(NormaliserKind.STICK_BREAKING, scale=1.0, power=0.0, bias=0.3,
                      attends_current=current)
    weights = made.weights(scores, _causal().expand(scores.shape))
    found = fit_normaliser(weights, scores, _causal())
    assert found.kind is NormaliserKind.STICK_BREAKING and found.attends_current is current
    assert found.scale == pytest.approx(1.0) and found.bias == pytest.approx(0.3)


def test_a_selection_that_differs_by_input_is_told_from_a_fixed_structure():
    scores = _scores(2)
    chosen = scores.topk(2, dim=-1).indices
    selected = torch.zeros_like(scores, dtype=torch.bool).scatter(-1, chosen, True)
    weights = torch.softmax(scores.masked_fill(~selected, float("-inf")), -1)
    everything = torch.ones(1, 1, LENGTH, LENGTH, dtype=torch.bool)
    assert fit_normaliser(weights, scores, everything).kind is NormaliserKind.SELECTED
    # The same keys left out of every input's rows (a diagonal masked): structure, a softmax.
    fixed = torch.softmax(scores.masked_fill(torch.eye(LENGTH, dtype=torch.bool), float("-inf")), -1)
    assert fit_normaliser(fixed, scores, everything) is None


def test_the_laws_of_length_and_width_are_measured():
    at = {(n, w): Normaliser(NormaliserKind.SIGMOID, scale=w ** -0.5, bias=-math.log(n))
          for n in (4, 7) for w in (7, 12)}
    found = laws((at[4, 7], at[7, 7]), (4, 7), at[4, 12], (7, 12))
    assert (found.scale, found.power, found.bias, found.log_length) == (1.0, -0.5, 0.0, -1.0)
    assert found.describe().startswith("sigmoid(q·k/sqrt(d) - log n)")
    moved = Normaliser(NormaliserKind.SIGMOID, scale=0.9, bias=0.0)
    assert laws((at[4, 7], moved), (4, 7), None, (7, 12)) is None


def test_softmax_properties_are_not_asked_of_another_normaliser():
    sigmoid = Normaliser(NormaliserKind.SIGMOID, scale=1.0, evidence="row 0 sums to 0.446")
    plain = Capabilities()
    other = replace(plain, position=replace(plain.position,
                                            encoding=PositionEncoding(normaliser=sigmoid)))
    assert unmet(frozenset({Structure.SOFTMAX}), plain, "rows summing to 1") is None
    said = unmet(frozenset({Structure.SOFTMAX}), other, "rows summing to 1")
    assert said.startswith("its weights are sigmoid(") and "row 0 sums to 0.446" in said


@torch.no_grad()
def _one_pair_at_a_time(layer, x: torch.Tensor, keep: torch.Tensor | None, row) -> torch.Tensor:
    """The layer's output computed from its parameters in float64, one query and key at a time:
    ``row(q_i, keys, i, n)`` gives the weights {j: w} of query i over the kept keys {j: k_j}
    (each a head's slice)."""
    qkv = layer.qkv.weight.double() @ x.double()[..., None]
    q, k, v = (t[..., 0] + b for t, b in zip(qkv.chunk(3, dim=-2), layer.qkv.bias.double().chunk(3),
                                             strict=True))
    b, n, d = x.shape
    heads = layer.num_heads
    e = d // heads
    out = torch.zeros(b, n, d, dtype=torch.float64)
    for batch in range(b):
        seen = [j for j in range(n) if keep is None or bool(keep[batch, j])]
        for h in range(heads):
            part = slice(h * e, (h + 1) * e)
            for i in range(n):
                keys = {j: k[batch, j, part] for j in seen}
                for j, w in row(q[batch, i, part], keys, i, n).items():
                    out[batch, i, part] += w * v[batch, j, part]
    return out @ layer.out.weight.double().T + layer.out.bias.double()


def _oracle(layer, x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Each operator of q.k: its weights from the scaled products, one query at a time."""
    def row(query, keys, i, n):
        scale = math.sqrt(query.shape[0])
        return _weights(layer, {j: float(query @ key) / scale for j, key in keys.items()}, i, n)

    return _one_pair_at_a_time(layer, x, keep, row)


def _weights(layer, s: dict[int, float], i: int, n: int) -> dict[int, float]:
    def sigmoid(z):
        return 1 / (1 + math.exp(-z))

    if isinstance(layer, ops.SigmoidAttention):
        return {j: sigmoid(z - math.log(n)) for j, z in s.items()}
    if isinstance(layer, ops.StickBreakingAttention):
        visible = sorted((j for j in s if j < i or (j == i and layer.attend_current)),
                         reverse=True)
        weights, left = {}, 1.0
        for j in visible:  # nearest first: each takes beta of what is left
            weights[j] = sigmoid(s[j]) * left
            left *= 1 - sigmoid(s[j])
        return weights
    if isinstance(layer, ops.SoftcapAttention):
        s = {j: layer.softcap * math.tanh(z / layer.softcap) for j, z in s.items()}
    if not s:
        return {}
    top = max(s.values())
    total = sum(math.exp(z - top) for z in s.values())
    return {j: math.exp(z - top) / total for j, z in s.items()}


@pytest.mark.parametrize("cls", [ops.SigmoidAttention, ops.StickBreakingAttention,
                                 ops.StrictStickBreakingAttention, ops.ZeroSafeSoftmaxAttention,
                                 ops.SoftcapAttention], ids=lambda c: c.__name__)
def test_each_operator_is_what_its_paper_says(cls):
    torch.manual_seed(0)
    layer = cls(8, 2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 0, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    for mask in (None, keep):
        assert torch.allclose(layer(x, mask), _oracle(layer, x, mask), atol=1e-10)


def test_top_k_selects_the_best_visible_keys():
    torch.manual_seed(0)
    layer = ops.TopKIndexerAttention(8, 2, topk=2).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    base = layer(x)
    later = x.clone()
    later[:, 4:] += 1.0
    assert torch.equal(layer(later)[:, :4], base[:, :4])  # causal: the future moves nothing


def test_a_softmax_over_the_queries_is_a_mistake_left_to_the_checks():
    scores = _scores(3)
    everything = torch.ones(1, 1, LENGTH, LENGTH, dtype=torch.bool)
    assert fit_normaliser(torch.softmax(scores, dim=-2), scores, everything) is None


def test_a_rectified_map_is_fitted_with_its_length_law():
    at = {}
    for n in (4, 7):
        scores = _scores(4, n)
        everything = torch.ones(1, 1, n, n, dtype=torch.bool)
        at[n] = fit_normaliser(torch.relu(scores / math.sqrt(7)) / n, scores, everything)
        assert at[n].kind is NormaliserKind.RECTIFIED
    wide = fit_normaliser(torch.relu(_scores(4, 4) / math.sqrt(12)) / 4, _scores(4, 4),
                          torch.ones(1, 1, 4, 4, dtype=torch.bool))
    found = laws((at[4], at[7]), (4, 7), wide, (7, 12))
    assert (found.scale, found.power, found.length_power) == (1.0, -0.5, -1.0)
    assert found.describe().startswith("max(0, q·k/sqrt(d)) / n")


def _linear_oracle(layer, x, keep, causal: bool) -> torch.Tensor:
    """Linear attention one query and key at a time: w_ij = phi(q_i).phi(k_j) over the visible
    keys' sum (plus the layer's eps), phi elu + 1 (or relu of q and k scaled by e^-1/4)."""
    relu = isinstance(layer, ops.CausalLinearAttention)

    def phi(t):
        return torch.relu(t * t.shape[0] ** -0.25) if relu else torch.nn.functional.elu(t) + 1

    def row(query, keys, i, n):
        products = {j: float(phi(query) @ phi(key)) for j, key in keys.items()
                    if not causal or j <= i}
        total = sum(products.values()) + getattr(layer, "eps", 0.0)
        # relu features that meet nowhere: the row weighs nothing
        return {j: p / total for j, p in products.items()} if total else {}

    return _one_pair_at_a_time(layer, x, keep, row)


@pytest.mark.parametrize("cls,causal", [(ops.LinearAttention, False),
                                        (ops.CausalLinearAttention, True)],
                         ids=["elu+1", "causal relu"])
def test_linear_attention_is_what_its_paper_says(cls, causal):
    torch.manual_seed(0)
    layer = cls(8, 2).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    keep = torch.tensor([[1, 1, 1, 0, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    for mask in (None, keep):
        assert torch.allclose(layer(x, mask), _linear_oracle(layer, x, mask, causal), atol=1e-10)


def _qk(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, LENGTH, 4, generator=generator, dtype=torch.float64)
                 for _ in range(2))


def test_linear_attention_is_told_from_a_softmax_by_its_feature_map():
    q, k = _qk()
    everything = torch.ones(1, 1, LENGTH, LENGTH, dtype=torch.bool)
    products = (torch.nn.functional.elu(q) + 1) @ (torch.nn.functional.elu(k) + 1).transpose(-1, -2)
    weights = products / (products.sum(-1, keepdim=True) + 1e-6)
    found = fit_normaliser(weights, q @ k.transpose(-1, -2), everything, q, k)
    assert found.kind is NormaliserKind.LINEAR and found.feature == "elu + 1"
    assert found.epsilon == pytest.approx(1e-6, rel=1e-6)
    causal = _causal()
    relu = (torch.relu(q) @ torch.relu(k).transpose(-1, -2)).masked_fill(~causal, 0.0)
    totals = relu.sum(-1, keepdim=True)
    relu = torch.where(totals > 0, relu / totals.clamp_min(1e-300), 0.0)
    assert fit_normaliser(relu, q @ k.transpose(-1, -2), causal, q, k).feature == "relu"
    scores = q @ k.transpose(-1, -2)
    assert fit_normaliser(torch.softmax(scores / 2, -1), scores, everything, q, k) is None
