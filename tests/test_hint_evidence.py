"""A likely bug is named only where the case tells it apart from the correct computation: every
hint is given a case where its bug computes exactly what correct attention computes (a head
split without transpose at one head, repeat and repeat_interleave with one key/value head, the
heads mixed with the batch at one head), and must stay silent there; where the two differ, the
same hint is given."""

from __future__ import annotations

import torch

from conformance.checks.diagnosis import (
    batch_heads_mixed,
    explain,
    form_hint,
    reproduces,
    scale_groups,
    tiled_groups,
)
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import reference_attention
from conformance.subject.boundary import Inputs

VIEW = "matches heads split with view(B, H, L, Dh) and no transpose"


def _weights(heads: int, kv_heads: int, head_dim: int, seed: int = 0) -> HeadWeights:
    g = torch.Generator().manual_seed(seed)
    d_model = heads * head_dim

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return HeadWeights(w_q=randn(heads, head_dim, d_model), b_q=randn(heads, head_dim),
                       w_k=randn(kv_heads, head_dim, d_model), b_k=randn(kv_heads, head_dim),
                       w_v=randn(kv_heads, head_dim, d_model), b_v=randn(kv_heads, head_dim),
                       w_o=randn(d_model, d_model), b_o=randn(d_model))


def _inputs(weights: HeadWeights, batch: int = 2, length: int = 5) -> Inputs:
    x = torch.randn(batch, length, weights.w_q.shape[-1], dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1))
    return Inputs.self_attention(x)


def _correct(weights: HeadWeights, inputs: Inputs) -> torch.Tensor:
    return reference_attention(weights, inputs.query, inputs.key, inputs.value,
                               causal=False).output


def test_a_head_split_without_transpose_is_not_named_at_one_head():
    weights = _weights(heads=1, kv_heads=1, head_dim=8)
    inputs = _inputs(weights)
    assert explain(_correct(weights, inputs), weights, inputs, causal=False) is None


def test_a_head_split_without_transpose_is_named_where_it_differs():
    from conformance.checks.diagnosis import _misshaped

    weights = _weights(heads=2, kv_heads=2, head_dim=4)
    inputs = _inputs(weights)
    output = _misshaped(weights, inputs, causal=False, split_transposed=False,
                        merge_transposed=True)
    assert explain(output, weights, inputs, causal=False) == VIEW


def test_repeat_is_not_named_with_one_key_value_head():
    weights = _weights(heads=4, kv_heads=1, head_dim=3)
    inputs = _inputs(weights)
    tiled = _correct(tiled_groups(weights), inputs)  # the same as the correct one here
    assert form_hint(tiled, weights, inputs, causal=False) is None
    assert explain(tiled, weights, inputs, causal=False) is None


def test_repeat_is_named_where_it_differs():
    weights = _weights(heads=4, kv_heads=2, head_dim=3)
    inputs = _inputs(weights)
    hint = form_hint(_correct(tiled_groups(weights), inputs), weights, inputs, causal=False)
    assert hint is not None and "repeat instead of repeat_interleave" in hint


def test_heads_mixed_with_the_batch_are_not_named_at_one_batch_element():
    weights = _weights(heads=2, kv_heads=2, head_dim=4)
    inputs = _inputs(weights, batch=1)
    correct = _correct(weights, inputs)
    mixed = batch_heads_mixed(weights, inputs, causal=False)
    assert not reproduces(correct, mixed, correct, None)
    two = _inputs(weights, batch=2)
    assert reproduces(batch_heads_mixed(weights, two, causal=False),
                      batch_heads_mixed(weights, two, causal=False), _correct(weights, two), None)


def test_scales_equal_at_this_size_are_named_together():
    """At 4 heads of 4, dividing by sqrt(num_heads) and by sqrt(head_dim) are one scale: no
    candidate equal to the correct one is offered, and the 1/sqrt(d_model) one is alone."""
    groups = dict(scale_groups(head_dim=4, num_heads=4))
    assert not any("1/sqrt(num_heads)" in words for words in groups)  # == 1/sqrt(head_dim)
    groups = dict(scale_groups(head_dim=2, num_heads=4))
    merged = [words for words in groups if "each of" in words]
    assert merged and "1/sqrt(num_heads)" in merged[0] and "1/head_dim" in merged[0]


def test_a_results_hint_is_plain_text_with_its_kind_beside_it():
    """A hint naming a kind of bug reaches a result as a plain ``str`` (pytest-xdist's serializer
    knows no subclass of it: a worker carrying one died), its kind in ``bug``."""
    from conformance.model.results import CheckResult, Hint, Status

    result = CheckResult("impl", "reference", "cpu", Status.FAILED,
                         hint=Hint("matches the reference without its output projection",
                                   "output projection skipped"))
    assert type(result.hint) is str and result.bug == "output projection skipped"
    assert type(result.to_dict()["hint"]) is str
