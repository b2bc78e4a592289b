"""The float64 reference agrees with PyTorch's own attention and follows its stated policy."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conformance.model.weights import HeadWeights
from conformance.numerics.reference import allowed_keys, reference_attention


def _weights(heads: int, head_dim: int, d_in: int, *, out: bool = True, seed: int = 0):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    d = heads * head_dim
    return HeadWeights(r(heads, head_dim, d_in), r(heads, head_dim), r(heads, head_dim, d_in),
                       r(heads, head_dim), r(heads, head_dim, d_in), r(heads, head_dim),
                       r(d_in, d) if out else None, r(d_in) if out else None)


def _sdpa(w: HeadWeights, q_in, k_in, v_in, mask=None, causal=False):
    def project(x, weight, bias):
        return torch.einsum("bld,hed->bhle", x, weight) + bias[None, :, None, :]

    out = F.scaled_dot_product_attention(project(q_in, w.w_q, w.b_q), project(k_in, w.w_k, w.b_k),
                                         project(v_in, w.w_v, w.b_v), attn_mask=mask,
                                         is_causal=causal)
    b, _, lq, _ = out.shape
    concat = out.transpose(1, 2).reshape(b, lq, -1)
    return concat if w.w_o is None else concat @ w.w_o.T + w.b_o


@pytest.mark.parametrize("heads,head_dim,lq,lk,causal", [
    (1, 4, 3, 3, False), (3, 2, 5, 5, False), (2, 5, 4, 7, False),
    (1, 4, 3, 3, True), (3, 2, 5, 5, True),
])
def test_matches_sdpa(heads, head_dim, lq, lk, causal):
    w = _weights(heads, head_dim, 6)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, n, 6, generator=g, dtype=torch.float64) for n in (lq, lk, lk))
    keep = torch.ones(2, lk, dtype=torch.bool)
    keep[1, -1] = False
    expected = _sdpa(w, q, k, v, mask=None if causal else keep[:, None, None, :], causal=causal)
    got = reference_attention(w, q, k, v, keep=None if causal else keep, causal=causal)
    torch.testing.assert_close(got.output, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.attention.sum(-1), torch.ones(2, heads, lq, dtype=torch.float64))


def test_attention_zero_on_masked_keys_and_future():
    w = _weights(2, 3, 4)
    x = torch.randn(1, 4, 4, dtype=torch.float64)
    keep = torch.tensor([[True, False, True, True]])
    attention = reference_attention(w, x, x, x, keep=keep, causal=True).attention
    assert torch.all(attention[..., 1] == 0)
    assert torch.all(attention.triu(diagonal=1) == 0)


@pytest.mark.parametrize("policy,check", [
    ("zeros", lambda a: torch.all(a == 0)),
    ("nan", lambda a: torch.all(torch.isnan(a))),
    ("uniform", lambda a: torch.allclose(a, torch.full_like(a, 1 / 3))),
])
def test_fully_masked_rows_follow_the_policy(policy, check):
    w = _weights(2, 2, 4)
    x = torch.randn(2, 3, 4, dtype=torch.float64)
    keep = torch.tensor([[True, True, False], [False, False, False]])
    result = reference_attention(w, x, x, x, keep=keep, fully_masked=policy)
    assert check(result.attention[1])
    assert torch.isfinite(result.output[0]).all()
    if policy == "zeros":  # zero attention output: the layer output is the output bias
        torch.testing.assert_close(result.output[1], w.b_o.expand(3, -1))


def test_default_scale_is_one_over_sqrt_head_dim():
    w = _weights(1, 4, 4, out=False)
    x = torch.randn(1, 3, 4, dtype=torch.float64)
    default = reference_attention(w, x, x, x).output
    explicit = reference_attention(w, x, x, x, scale=1 / math.sqrt(4)).output
    other = reference_attention(w, x, x, x, scale=1 / 4).output
    torch.testing.assert_close(default, explicit, rtol=0, atol=0)
    assert not torch.allclose(default, other)


def test_allowed_keys_is_top_left_causal():
    allowed = allowed_keys(1, 2, 3, None, causal=True)[0, 0]
    assert allowed.tolist() == [[True, False, False], [True, True, False]]
