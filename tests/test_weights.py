"""Weight layouts read and write the canonical per-head form faithfully."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conformance.implementations import seed001_self_attention_steps as seed001
from conformance.implementations import seed003_causal_multihead_attention as seed003
from conformance.implementations.mutants.textbook import TextbookAttention
from conformance.model.declared_layouts import (
    FusedProjection,
    PackedInProjection,
    PerHeadModules,
    SeparateProjections,
)
from conformance.model.weights import HeadWeights, WeightLayoutError

LAYOUTS = [
    (lambda: TextbookAttention(6, 3), SeparateProjections("q_proj", "k_proj", "v_proj", "out_proj"), 3),
    (lambda: seed001.SelfAttentionTwo(4, 4), FusedProjection("linear_qkv"), 1),
    (lambda: seed003.MultiHeadAttentionWrapper(4, 2, 8, 0.0, 3, qkv_bias=True),
     PerHeadModules("heads", "W_query", "W_key", "W_value"), 3),
    (lambda: nn.MultiheadAttention(6, 2, batch_first=True), PackedInProjection(), 2),
]


@pytest.mark.parametrize("make,layout,heads", LAYOUTS, ids=lambda v: type(v).__name__)
def test_write_then_read_round_trips(make, layout, heads):
    module = make()
    original = layout.read(module, heads)
    changed = original.map(lambda t: torch.randn_like(t))
    layout.write(module, changed)
    again = layout.read(module, heads)
    for (name, a), (_, b) in zip(changed._fields(), again._fields(), strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_separate_projections_take_heads_as_row_blocks():
    module = TextbookAttention(6, 3)
    weights = SeparateProjections("q_proj", "k_proj", "v_proj", "out_proj").read(module, 3)
    assert weights.w_q.shape == (3, 2, 6)
    torch.testing.assert_close(weights.w_q[1], module.q_proj.weight[2:4])
    torch.testing.assert_close(weights.b_v[2], module.v_proj.bias[4:6])


def test_missing_bias_reads_as_zero_and_refuses_a_non_zero_one():
    module = seed003.MultiHeadAttention(4, 4, 8, 0.0, 2)  # qkv_bias=False
    layout = SeparateProjections("W_query", "W_key", "W_value", "out_proj")
    weights = layout.read(module, 2)
    assert torch.all(weights.b_q == 0)
    layout.write(module, weights)  # zeros are fine
    with pytest.raises(WeightLayoutError, match="no bias"):
        layout.write(module, weights.map(lambda t: t + 1))


def test_unknown_submodule_is_a_layout_error():
    with pytest.raises(WeightLayoutError, match="no submodule 'query'"):
        SeparateProjections("query", "key", "value").read(TextbookAttention(4, 2), 2)


def test_permute_heads_moves_head_blocks_and_output_columns_together():
    g = torch.Generator().manual_seed(0)
    w = HeadWeights(*(torch.randn(s, generator=g) for s in
                      [(3, 2, 6), (3, 2), (3, 2, 6), (3, 2), (3, 2, 6), (3, 2), (6, 6), (6,)]))
    p = w.permute_heads([2, 0, 1])
    torch.testing.assert_close(p.w_q[0], w.w_q[2])
    torch.testing.assert_close(p.w_o[:, 0:2], w.w_o[:, 4:6])
    torch.testing.assert_close(p.b_o, w.b_o)
    assert w.head(1).num_heads == 1 and w.head(1).w_o is None


def test_paths_deep_in_a_model_say_their_common_parent_once():
    from conformance.model.weights import named_together

    deep = [f"inner.model.layers.0.self_attn.{name}" for name in ("q_proj", "k_proj", "v_proj")]
    assert named_together(deep) == "q_proj/k_proj/v_proj of model.layers.0.self_attn"
    assert named_together(["q_proj", "k_proj", "v_proj"]) == "q_proj/k_proj/v_proj"
    assert named_together(["attn.q", "attn.k", "out"]) == "attn.q/attn.k/out"
