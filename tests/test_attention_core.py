"""The attention core observed inside a forward (conformance.subject.core_trace and
attention_core), and what two forwards measure there (conformance.numerics.core_fit): on
attention written in each way it is written, each site against what the code computes."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conformance.model.core import CoreKind
from conformance.numerics.core_fit import (
    BiasForm,
    bias_form,
    bias_tolerance,
    fitted_scale,
    logit_bias,
)
from conformance.subject.attention_core import sites
from conformance.subject.core_trace import CoreTracer

B, L, H, D = 2, 5, 3, 4
WEIGHTS = [torch.randn(H * D, H * D, generator=torch.Generator().manual_seed(i)) / 4
           for i in range(3)]


def tokens(seed: int) -> torch.Tensor:
    return torch.randn(B, L, H * D, generator=torch.Generator().manual_seed(100 + seed))


def split(t: torch.Tensor) -> torch.Tensor:
    return t.view(B, L, H, D).transpose(1, 2)


def qkv(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(split(x @ w) for w in WEIGHTS)


def merge(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).reshape(B, L, -1)


def observed(forward, seed: int = 0, kv_len: int = L):
    tracer = CoreTracer()
    x = tokens(seed)
    tracer.taint(x)
    with torch.no_grad(), tracer:
        forward(x)
    return sites(tracer, L, kv_len)


def scale_of(forward) -> float:
    (first,), (second,) = observed(forward, 0), observed(forward, 1)
    scale, residual = fitted_scale(first, second)
    assert residual < 1e-4
    return scale


def textbook(x):
    q, k, v = qkv(x)
    return merge(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), dim=-1) @ v)


def test_a_textbook_core_is_observed_with_its_width_weights_and_values():
    (site,) = observed(textbook)
    assert site.kind is CoreKind.SOFTMAX and site.widths == (D,) and site.over_keys
    assert site.used.shape == (B * H, L, L) and site.values.shape == (B * H, L, D)
    torch.testing.assert_close(site.used @ site.values, site.result)
    assert site.departures() == ()
    assert scale_of(textbook) == pytest.approx(1 / math.sqrt(D))


def rotate_half(t):
    return torch.cat((-t[..., D // 2:], t[..., : D // 2]), dim=-1)


COS, SIN = torch.randn(L, D), torch.randn(L, D)


def prescaled_rope(x):
    """q scaled before RoPE: the scalar is still found on every path to q."""
    q, k, v = qkv(x)
    q = q * D ** -0.5
    q, k = (t * COS + rotate_half(t) * SIN for t in (q, k))
    return merge((q @ k.transpose(-1, -2)).softmax(dim=-1) @ v)


def einsum_heads_last(x):
    q, k, v = (t.transpose(1, 2) for t in qkv(x))  # (B, L, H, D)
    a = F.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) * D ** -0.5, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", a, v).reshape(B, L, -1)


def fairseq_bmm(x):
    q, k, v = (t.reshape(B * H, L, D) for t in qkv(x))
    s = torch.baddbmm(torch.zeros(B * H, L, L), q, k.transpose(1, 2), alpha=D ** -0.5)
    s = s.view(B, H, L, L).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1),
                                       float("-inf")).view(B * H, L, L)
    return torch.bmm(torch.softmax(s, -1), v).view(B, H, L, D).transpose(1, 2).reshape(B, L, -1)


def sdpa(x):
    q, k, v = qkv(x)
    return merge(F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("forward", [prescaled_rope, einsum_heads_last, fairseq_bmm, sdpa])
def test_every_way_of_writing_it_shows_its_scale(forward):
    assert scale_of(forward) == pytest.approx(1 / math.sqrt(D))


def test_sdpa_states_its_mask():
    (site,) = observed(sdpa)
    assert site.kind is CoreKind.SDPA and site.scale == pytest.approx(D ** -0.5)
    assert torch.equal(site.allowed[0], torch.ones(L, L, dtype=torch.bool).tril())


def over_queries(x):
    q, k, v = qkv(x)
    return merge(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), dim=-2) @ v)


def test_a_softmax_over_the_queries_is_seen_by_the_product_with_the_values():
    (site,) = observed(over_queries)
    assert site.over_keys is False


BIAS = torch.randn(H, 2 * L - 1, generator=torch.Generator().manual_seed(9))
DISTANCE = torch.arange(L)[None, :] - torch.arange(L)[:, None] + L - 1


def t5_like(x):
    """No scaling; a learned bias of j - i added; softmax in float32."""
    q, k, v = qkv(x)
    scores = q @ k.transpose(-1, -2) + BIAS[:, DISTANCE][None]
    return merge(torch.softmax(scores.float(), dim=-1).type_as(scores) @ v)


ABSOLUTE = torch.randn(H, L, L, generator=torch.Generator().manual_seed(10))


def absolute_bias(x):
    q, k, v = qkv(x)
    return merge(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D) + ABSOLUTE, -1) @ v)


@pytest.mark.parametrize(("forward", "scale", "form"), [
    (textbook, 1 / math.sqrt(D), BiasForm.NONE),
    (t5_like, 1.0, BiasForm.RELATIVE),
    (absolute_bias, 1 / math.sqrt(D), BiasForm.ABSOLUTE),
])
def test_two_forwards_measure_the_scale_and_how_the_bias_depends_on_positions(forward, scale,
                                                                              form):
    (first,), (second,) = observed(forward, 0), observed(forward, 1)
    fitted, _ = fitted_scale(first, second)
    assert fitted == pytest.approx(scale, rel=1e-5)
    assert bias_form(logit_bias(first, second, fitted), bias_tolerance(first)) is form


def mla_two_terms(x):
    """MLA's rotary part as a second product summed into the logits."""
    q, k, v = qkv(x)
    q_pe = (x @ WEIGHTS[0][:, : H * 2]).view(B, L, H, 2).transpose(1, 2)
    k_pe = (x @ WEIGHTS[1][:, :2])[:, None]
    scores = (q @ k.transpose(-1, -2) + q_pe @ k_pe.transpose(-1, -2)) * (D + 2) ** -0.5
    return merge(scores.softmax(-1) @ v)


def mla_joined(x):
    """MLA's rotary part joined to q and k before one product."""
    q, k, v = qkv(x)
    q_pe = (x @ WEIGHTS[0][:, : H * 2]).view(B, L, H, 2).transpose(1, 2)
    k_pe = (x @ WEIGHTS[1][:, :2])[:, None].expand(B, H, L, 2)
    q, k = torch.cat([q, q_pe], -1), torch.cat([k, k_pe], -1)
    return merge((q @ k.transpose(-1, -2) * (D + 2) ** -0.5).softmax(-1) @ v)


@pytest.mark.parametrize("forward", [mla_two_terms, mla_joined])
def test_mla_counts_the_rotary_width_and_says_its_parts(forward):
    (site,) = observed(forward)
    assert site.widths[0] == D + 2 and site.term_widths == (D, 2)
    assert scale_of(forward) == pytest.approx((D + 2) ** -0.5)


LATENT = 7
W_UK = torch.randn(H, D, LATENT, generator=torch.Generator().manual_seed(11))
W_DKV = torch.randn(H * D, LATENT, generator=torch.Generator().manual_seed(12)) / 4


def absorbed(x):
    """The query absorbs the key up-projection: the scores contract the latent width."""
    q, _, _ = qkv(x)
    latent = F.layer_norm(x @ W_DKV, (LATENT,))
    q_latent = torch.einsum("bhqd,hdc->bqhc", q, W_UK)
    a = (torch.einsum("bqhc,bkc->bqhk", q_latent, latent) * D ** -0.5).softmax(-1)
    return torch.einsum("bqhk,bkc->bqhc", a, latent)[..., :D].reshape(B, L, -1)


def test_an_absorbed_projection_offers_the_width_before_absorption():
    (site,) = observed(absorbed)
    assert site.widths == (LATENT, D)


SINK = torch.randn(H)


def with_sinks(x):
    q, k, v = qkv(x)
    scores = torch.cat([q @ k.transpose(-1, -2) / math.sqrt(D),
                        SINK.view(1, H, 1, 1).expand(B, H, L, 1)], dim=-1)
    return merge(scores.softmax(-1)[..., :-1] @ v)


def differential(x):
    q, k, v = qkv(x)
    (q1, q2), (k1, k2) = q.chunk(2, -1), k.chunk(2, -1)
    maps = [torch.softmax(a @ b.transpose(-1, -2) / math.sqrt(D // 2), -1)
            for a, b in ((q1, k1), (q2, k2))]
    return merge((maps[0] - 0.3 * maps[1]) @ v)


def test_sinks_and_combined_maps_are_designs_said_as_departures():
    (site,) = observed(with_sinks)
    assert site.sinks == 1 and site.used.shape[-1] == L
    assert "attention sinks" in site.departures()[0]
    first, second = observed(differential)
    assert first.combined == second.combined == 2 and first.widths == (D // 2,)
    assert "differential" in first.departures()[0]


def mask_after_softmax(x):
    q, k, v = qkv(x)
    keep = torch.tensor([1.0, 1, 1, 0, 0])
    return merge(torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1) * keep @ v)


def test_weights_changed_after_the_softmax_are_what_multiplies_the_values():
    (site,) = observed(mask_after_softmax)
    assert site.combined == 1 and site.departures() == ()
    assert float(site.used.sum(-1).max()) < 0.999
    torch.testing.assert_close(site.used, site.probabilities * torch.tensor([1.0, 1, 1, 0, 0]))


def mask_cast_like_the_weights_added_after(x):
    q, k, v = qkv(x)
    probabilities = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1)
    mask = (x[:, :, 0] > 0)[:, None, None, :]  # made from the tokens, as a mask argument is
    return merge((probabilities + mask.to(probabilities)) @ v)


def test_a_tensor_cast_like_the_weights_is_not_made_from_them():
    """Swin's ``mask.to(attn)``: the mask takes the weights' dtype, not their values, so the
    weights that multiply the values combine one softmax map (and row_stochastic judges them),
    not two (which it would excuse as differential attention)."""
    (site,) = observed(mask_cast_like_the_weights_added_after)
    assert site.combined == 1 and site.departures() == ()
    assert float(site.used.sum(-1).max()) > 1.5


def sdpa_normalised(x):
    q, k, v = qkv(x)
    q, k = (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) for t in (q, k))
    return merge(F.scaled_dot_product_attention(q, k, v))


def sdpa_broadcast_from_one_wide(x):
    q, k, v = qkv(x)
    q, k = (t[..., :1] * torch.ones(2) for t in (q, k))  # HF's RoPE at head width 1: two columns
    return merge(F.scaled_dot_product_attention(q, k, v[..., :2], scale=1.0))


def test_an_sdpa_core_says_its_qk_norm_and_the_width_its_operands_were_broadcast_from():
    """As a softmax core does: Qwen 3 through its model calls SDPA, after a per-head QK-norm,
    and at head width 1 its RoPE hands SDPA q and k two columns wide."""
    (site,) = observed(sdpa_normalised)
    assert site.kind is CoreKind.SDPA and site.qk_norm == "head"
    (site,) = observed(sdpa_broadcast_from_one_wide)
    assert site.widths == (2, 1)


def softcapped(x):
    q, k, v = qkv(x)
    scores = torch.tanh(q @ k.transpose(-1, -2) * D ** -0.5 / 3.0) * 3.0
    return merge(scores.softmax(-1) @ v)


def test_a_softcap_is_read_and_undone_before_the_scale_is_fitted():
    (site,) = observed(softcapped)
    assert site.softcap == pytest.approx(3.0)
    assert scale_of(softcapped) == pytest.approx(D ** -0.5, rel=1e-4)


ROUTER = torch.randn(H * D, 4, generator=torch.Generator().manual_seed(13))


def router(x):
    """A softmax over experts weighting expert outputs: no attention core."""
    gates = torch.softmax(x @ ROUTER, dim=-1)
    experts = torch.stack([x * (i + 1) for i in range(4)], dim=-2)
    return torch.einsum("ble,bled->bld", gates, experts)


def test_a_softmax_over_something_else_than_keys_is_no_core():
    assert observed(router) == ()


def test_torch_multihead_attention_fast_path_shows_no_core_and_changes_nothing():
    layer = torch.nn.MultiheadAttention(H * D, H, batch_first=True).eval()
    x = tokens(0)
    expected = layer(x, x, x, need_weights=False)[0]
    tracer = CoreTracer()
    tracer.taint(x)
    with torch.no_grad(), tracer:
        seen = layer(x, x, x, need_weights=False)[0]
    torch.testing.assert_close(seen, expected, rtol=0, atol=0)


def test_a_core_the_tokens_do_not_reach_is_not_the_layers():
    """A model driving a layer runs its other layers' attention on inputs of its own first (an
    encoder on a fixed spectrogram before a decoder's cross-attention): only the core whose
    logits the case's tokens reach is observed, whatever the others' scale."""
    harness = torch.randn(B, L, H * D)

    def after_a_harness_core(x):
        q, k, v = qkv(harness)
        F.scaled_dot_product_attention(q * 3.0, k, v)
        merge(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)
        return sdpa(x)

    (site,) = observed(after_a_harness_core)
    assert site.kind is CoreKind.SDPA
    assert scale_of(after_a_harness_core) == pytest.approx(1 / math.sqrt(D))
