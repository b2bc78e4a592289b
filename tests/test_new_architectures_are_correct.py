"""The new architectures are correct, proved without the suite: each correct class in
``tests/fixtures/new_architectures.py`` against attention computed here in float64 from its own
parameters with textbook formulas (RoPE as complex rotations, T5's buckets one pair at a time,
RMSNorm and LayerNorm spelled out, softmax(q k^T scale + bias) v with -inf masking); the absorbed
MLA against the plain one; cross-attention's cached call against its uncached one; packed
sequences against each sequence alone. Every broken twin differs from its correct class on an
input that shows its bug, and every class builds and runs from ``Cls(d_model, num_heads)`` in
float32, float64, bfloat16 and float16 at small and odd widths.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from tests.fixtures import new_architectures as arch
from tests.oracle import F64, heads, linear, merge, randn, rms, same_weights

LOOSE = {"rtol": 1e-5, "atol": 1e-5}
"""Layers whose rotary tables are float32 by design agree with float64 to float32's rounding."""


def build(cls, *args, seed=0, **kwargs):
    """``cls(*args, **kwargs)`` in float64, eval mode, from a fixed seed; the norms' weights (ones
    at construction) and biases made random so that they matter."""
    torch.manual_seed(seed)
    module = cls(*args, **kwargs).double().eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, (arch.RMSNorm, nn.LayerNorm)):
                sub.weight.add_(0.5 * torch.randn(sub.weight.shape, generator=generator,
                                                  dtype=F64))
            if isinstance(sub, nn.LayerNorm):
                sub.bias.add_(0.5 * torch.randn(sub.bias.shape, generator=generator, dtype=F64))
    return module


# -- textbook float64 pieces ---------------------------------------------------------------------

def attention(q, k, v, allowed=None, scale=None, bias=0.0):
    """softmax(q k^T * scale + bias, -inf where not ``allowed``) v over (..., L, d)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def rope(x, positions, theta=10000.0, interleaved=False):
    """Each pair of x's last dimension as a complex number a + ib turned by e^(i p theta_j),
    theta_j = theta^(-2j / D): pairs (2j, 2j + 1) when interleaved, else (j, j + D / 2).
    ``positions`` (L,) index x's second-to-last dimension."""
    dim = x.shape[-1]
    freqs = theta ** (-torch.arange(0, dim, 2, dtype=F64) / dim)
    angles = positions.to(F64)[:, None] * freqs
    turn = torch.polar(torch.ones_like(angles), angles)
    if interleaved:
        z = torch.complex(x[..., 0::2], x[..., 1::2]) * turn
        return torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    z = torch.complex(x[..., : dim // 2], x[..., dim // 2:]) * turn
    return torch.cat((z.real, z.imag), dim=-1)


def layer_norm(x, norm):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def causal(length):
    return torch.arange(length)[None, :] <= torch.arange(length)[:, None]


def kept(batch, length, counts):
    """(B, L) bool, element b keeping its first counts[b] tokens (right padding)."""
    keep = torch.zeros(batch, length, dtype=torch.bool)
    for b, count in enumerate(counts):
        keep[b, :count] = True
    return keep


def masks(length):
    """No mask, and right padding that keeps a key for every query."""
    return [None, kept(2, length, (length, max(1, length - 2)))]


def allowed_from(keep, length, is_causal):
    allowed = causal(length)[None, None] if is_causal else torch.ones(1, 1, length, length,
                                                                      dtype=torch.bool)
    return allowed if keep is None else allowed & keep[:, None, None, :]


LENGTHS = (1, 4, 9)


# -- 1. multi-head latent attention --------------------------------------------------------------

def mla_oracle(m, x, keep):
    length = x.shape[1]
    nope, rot, vdim, rank = m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank
    q = (linear(rms(linear(x, m.wq_a), m.q_norm.weight, 1e-6), m.wq_b) if m.q_lora_rank
         else linear(x, m.wq))
    q = heads(q, m.n_heads)
    latent = linear(x, m.wkv_a)
    c_kv, k_pe = rms(latent[..., :rank], m.kv_norm.weight, 1e-6), latent[..., rank:]
    kv = heads(linear(c_kv, m.wkv_b), m.n_heads)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    positions = torch.arange(length)
    q_pe = rope(q[..., nope:], positions, interleaved=m.rope_interleaved)
    k_pe = rope(k_pe[:, None], positions, interleaved=m.rope_interleaved)  # one shared head
    q = torch.cat((q[..., :nope], q_pe), dim=-1)
    k = torch.cat((k_nope, k_pe.expand(-1, m.n_heads, -1, -1)), dim=-1)
    assert v.shape[-1] == vdim
    out = attention(q, k, v, allowed_from(keep, length, True), scale=1 / math.sqrt(nope + rot))
    return linear(merge(out), m.wo)


MLA_CONFIGS = [
    {},
    {"q_lora_rank": 6, "qk_rope_head_dim": 4},
    {"qk_rope_head_dim": 4, "rope_interleaved": False, "qk_nope_head_dim": 3, "v_head_dim": 5},
]


@pytest.mark.parametrize("config", MLA_CONFIGS)
def test_mla_is_latent_attention_with_a_shared_rotary_key(config):
    module = build(arch.MultiHeadLatentAttention, 12, 3, **config)
    for length in LENGTHS:
        x = randn(2, length, 12, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), mla_oracle(module, x, keep),
                                       **LOOSE)


@pytest.mark.parametrize("config", MLA_CONFIGS)
def test_absorbed_mla_equals_plain_mla_with_the_same_weights(config):
    plain = build(arch.MultiHeadLatentAttention, 12, 3, **config)
    absorbed = same_weights(plain, arch.MultiHeadLatentAttentionAbsorbed, 12, 3, **config)
    assert set(absorbed.state_dict()) == set(plain.state_dict())
    x = randn(2, 9, 12, seed=3)
    for keep in masks(9):
        torch.testing.assert_close(absorbed(x, mask=keep), plain(x, mask=keep),
                                   rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(absorbed(x), mla_oracle(plain, x, None), **LOOSE)


def test_mla_scale_twin_forgets_the_rotary_width():
    module = build(arch.MultiHeadLatentAttention, 12, 3)
    twin = same_weights(module, arch.MLAScaleNopeOnly, 12, 3)
    assert twin.softmax_scale == pytest.approx(1 / math.sqrt(4))
    assert module.softmax_scale == pytest.approx(1 / math.sqrt(4 + 2))
    x = randn(2, 9, 12, seed=4)
    assert (twin(x) - module(x)).abs().max() > 1e-3


# -- 2. T5 ---------------------------------------------------------------------------------------

def t5_bucket(relative, bidirectional, num_buckets=32, max_distance=128):
    """T5's bucket of one relative position (key - query), in plain Python."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if relative > 0:
            bucket = num_buckets
        distance = abs(relative)
    else:
        distance = max(-relative, 0)
    exact = num_buckets // 2
    if distance < exact:
        return bucket + distance
    logarithmic = exact + int(math.log(distance / exact) / math.log(max_distance / exact)
                              * (num_buckets - exact))
    return bucket + min(logarithmic, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_are_t5s(bidirectional):
    relative = torch.arange(-300, 301)
    got = arch.relative_position_bucket(relative, bidirectional=bidirectional).tolist()
    assert got == [t5_bucket(r, bidirectional) for r in range(-300, 301)]
    known = ({-1: 1, 1: 17, -8: 8, -12: 9, -128: 15, -1000: 15, 1000: 31, 0: 0} if bidirectional
             else {5: 0, -5: 5, -16: 16, -127: 31, -1000: 31, 0: 0})
    for r, bucket in known.items():
        assert t5_bucket(r, bidirectional) == bucket


def t5_oracle(m, x, keep):
    length = x.shape[1]
    q, k, v = (heads(linear(x, layer), m.n_heads) for layer in (m.q, m.k, m.v))
    table = m.relative_attention_bias.weight  # (buckets, H)
    bias = torch.empty(m.n_heads, length, length, dtype=F64)
    for i in range(length):
        for j in range(length):
            bias[:, i, j] = table[t5_bucket(j - i, bidirectional=not m.is_decoder)]
    out = attention(q, k, v, allowed_from(keep, length, m.is_decoder), scale=1.0, bias=bias)
    return linear(merge(out), m.o)


@pytest.mark.parametrize("cls", [arch.T5Attention, arch.T5DecoderSelfAttention])
def test_t5_is_unscaled_attention_with_its_bucket_bias(cls):
    module = build(cls, 12, 3)
    assert module.relative_attention_bias.weight.abs().max() > 0.1
    for length in (1, 6, 20):  # 20: distances past the exact buckets
        x = randn(2, length, 12, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), t5_oracle(module, x, keep))
        if length > 2:  # an int mask, 1 = keep, reads the same
            keep = masks(length)[1]
            torch.testing.assert_close(module(x, mask=keep.long()), module(x, mask=keep))


def test_t5_mask_after_softmax_twin_leaves_rows_short_under_padding():
    module = build(arch.T5Attention, 12, 3)
    twin = same_weights(module, arch.T5MaskAfterSoftmax, 12, 3)
    x = randn(2, 9, 12, seed=5)
    torch.testing.assert_close(twin(x), module(x))  # exact without a mask
    keep = masks(9)[1]
    assert (twin(x, mask=keep) - module(x, mask=keep))[1].abs().max() > 1e-3


def test_t5_decoder_twin_drops_causality_under_a_mask():
    module = build(arch.T5DecoderSelfAttention, 12, 3)
    twin = same_weights(module, arch.T5DecoderCausalDroppedWithMask, 12, 3)
    x = randn(1, 6, 12, seed=6)
    torch.testing.assert_close(twin(x), module(x))  # causal without a mask
    keep = torch.ones(1, 6, dtype=torch.bool)
    changed = x.clone()
    changed[:, 3] += 1.0
    torch.testing.assert_close(module(changed, mask=keep)[:, :3], module(x, mask=keep)[:, :3])
    assert (twin(changed, mask=keep)[:, 2] - twin(x, mask=keep)[:, 2]).abs().max() > 1e-3


# -- 3. cross-attention with a cache -------------------------------------------------------------

def cross_oracle(m, x, encoder, keep):
    q = heads(linear(x, m.q_proj), m.num_heads)
    k, v = (heads(linear(encoder, layer), m.num_heads) for layer in (m.k_proj, m.v_proj))
    allowed = None if keep is None else keep[:, None, None, :]
    return linear(merge(attention(q, k, v, allowed)), m.out_proj)


def test_cross_attention_is_attention_to_the_encoder_and_its_cache_equals_it():
    module = build(arch.CrossAttentionWithCache, 12, 3)
    encoder = randn(2, 7, 12, seed=7)
    for keep in (None, kept(2, 7, (7, 3))):
        for length in LENGTHS:
            x = randn(2, length, 12, seed=length)
            out, present = module(x, encoder, encoder_attention_mask=keep)
            assert present is None
            torch.testing.assert_close(out, cross_oracle(module, x, encoder, keep))
        step = randn(2, 1, 12, seed=8)
        first, present = module(step, encoder, encoder_attention_mask=keep, use_cache=True)
        torch.testing.assert_close(first, cross_oracle(module, step, encoder, keep))
        assert [tuple(t.shape) for t in present] == [(2, 3, 7, 4), (2, 3, 7, 4)]
        x = randn(2, 2, 12, seed=9)
        cached, again = module(x, None, encoder_attention_mask=keep, past_key_value=present,
                               use_cache=True)
        assert again[0] is present[0] and again[1] is present[1]
        torch.testing.assert_close(cached, module(x, encoder, encoder_attention_mask=keep)[0])


def test_cross_attention_twin_drops_the_mask_on_cached_calls():
    module = build(arch.CrossAttentionWithCache, 12, 3)
    twin = same_weights(module, arch.CrossAttentionCacheIgnoresMask, 12, 3)
    encoder, x = randn(2, 7, 12, seed=7), randn(2, 2, 12, seed=9)
    keep = kept(2, 7, (7, 3))
    out, present = twin(x, encoder, encoder_attention_mask=keep, use_cache=True)
    torch.testing.assert_close(out, module(x, encoder, encoder_attention_mask=keep)[0])
    cached, _ = twin(x, None, encoder_attention_mask=keep, past_key_value=present)
    assert (cached - out)[1].abs().max() > 1e-3


# -- 4. differential attention -------------------------------------------------------------------

def differential_oracle(m, x, keep):
    length = x.shape[1]
    d, count = m.head_dim, m.num_heads
    q, k, v = (linear(x, layer) for layer in (m.q_proj, m.k_proj, m.v_proj))
    lam = (torch.exp(m.lambda_q1 @ m.lambda_k1) - torch.exp(m.lambda_q2 @ m.lambda_k2)
           + m.lambda_init)
    allowed = allowed_from(keep, length, True)[:, 0]
    outs = []
    for h in range(count):
        maps = []
        for half in (0, 1):
            cols = slice((2 * h + half) * d, (2 * h + half + 1) * d)
            scores = q[..., cols] @ k[..., cols].transpose(-1, -2) / math.sqrt(d)
            maps.append(torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1))
        out = (maps[0] - lam * maps[1]) @ v[..., 2 * h * d:2 * (h + 1) * d]
        outs.append(rms(out, m.subln.weight, 1e-5) * (1 - m.lambda_init))
    return linear(torch.cat(outs, dim=-1), m.out_proj)


@pytest.mark.parametrize(("d_model", "num_heads", "config", "width"),
                         [(16, 2, {}, 4), (12, 2, {"depth": 3}, 3), (6, 2, {}, 1), (8, 8, {}, 1)])
def test_differential_attention_is_a_difference_of_two_softmaxes(d_model, num_heads, config,
                                                                   width):
    module = build(arch.DifferentialAttention, d_model, num_heads, **config)
    assert module.head_dim == width
    depth = config.get("depth", 1)
    assert module.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * (depth - 1)))
    for length in LENGTHS:
        x = randn(2, length, d_model, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), differential_oracle(module, x, keep))


def test_differential_scale_twin_uses_the_whole_head_width():
    module = build(arch.DifferentialAttention, 16, 2)
    twin = same_weights(module, arch.DifferentialScaleFullWidth, 16, 2)
    x = randn(2, 9, 16, seed=10)
    assert (twin(x) - module(x)).abs().max() > 1e-3


# -- 5. soft-capped grouped-query attention ------------------------------------------------------

def softcap_oracle(m, x, keep):
    length = x.shape[1]
    group = m.num_heads // m.num_key_value_heads
    positions = torch.arange(length)
    q = rope(heads(linear(x, m.q_proj), m.num_heads), positions)
    k = rope(heads(linear(x, m.k_proj), m.num_key_value_heads), positions)
    v = heads(linear(x, m.v_proj), m.num_key_value_heads)
    kv_head = torch.arange(m.num_heads) // group  # query head h reads key/value head h // group
    k, v = k[:, kv_head], v[:, kv_head]
    scores = q @ k.transpose(-1, -2) / math.sqrt(m.query_pre_attn_scalar)
    cap = m.attn_logit_softcapping
    scores = cap * torch.tanh(scores / cap)
    out = attention(q, k, v, allowed_from(keep, length, True), scale=0.0, bias=scores)
    return linear(merge(out), m.o_proj)


@pytest.mark.parametrize(("d_model", "num_heads", "config", "kv_heads", "width"), [
    (16, 4, {}, 2, 4), (12, 3, {}, 1, 4), (10, 5, {}, 5, 2), (6, 2, {}, 1, 4),
    (16, 2, {"attn_logit_softcapping": 0.5, "query_pre_attn_scalar": 3.0}, 1, 8),
])
def test_softcap_attention_caps_then_masks(d_model, num_heads, config, kv_heads, width):
    module = build(arch.SoftcapAttention, d_model, num_heads, **config)
    assert (module.num_key_value_heads, module.head_dim) == (kv_heads, width)
    for length in LENGTHS:
        x = randn(2, length, d_model, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), softcap_oracle(module, x, keep),
                                       **LOOSE)


def test_softcap_twin_gives_masked_keys_weight_once_logits_reach_the_cap():
    x = randn(2, 9, 16, seed=11)
    keep = masks(9)[1]
    small = build(arch.SoftcapAttention, 16, 4, attn_logit_softcapping=1.0)
    twin = same_weights(small, arch.SoftcapAfterMask, 16, 4, attn_logit_softcapping=1.0)
    assert (twin(x, mask=keep) - small(x, mask=keep)).abs().max() > 1e-3
    module = build(arch.SoftcapAttention, 16, 4)  # the default cap of 50
    twin = same_weights(module, arch.SoftcapAfterMask, 16, 4)
    torch.testing.assert_close(twin(x, mask=keep), module(x, mask=keep))  # leak ~ e^-50
    large = 100 * x  # the logits saturate at +-50; masked keys sit at -50 too
    assert (twin(large) - module(large)).abs().max() > 1e-3


# -- 6. Perceiver latents ------------------------------------------------------------------------

def perceiver_oracle(m, x, keep):
    batch = x.shape[0]
    latents = layer_norm(m.latents, m.norm_latents).expand(batch, -1, -1)
    context = layer_norm(x, m.norm_context)
    q = heads(linear(latents, m.to_q), m.heads)
    k, v = (heads(t, m.heads) for t in linear(context, m.to_kv).chunk(2, dim=-1))
    allowed = None if keep is None else keep[:, None, None, :]
    return linear(merge(attention(q, k, v, allowed)), m.to_out)


def test_perceiver_latents_attend_to_the_input():
    module = build(arch.PerceiverLatentAttention, 12, 3, num_latents=5)
    for length in LENGTHS:
        x = randn(2, length, 12, seed=length)
        for keep in masks(length):
            out = module(x, mask=keep)
            assert out.shape == (2, 5, 12)
            torch.testing.assert_close(out, perceiver_oracle(module, x, keep))


def test_perceiver_twin_reads_the_padding():
    module = build(arch.PerceiverLatentAttention, 12, 3)
    twin = same_weights(module, arch.PerceiverMaskIgnored, 12, 3)
    x, keep = randn(2, 9, 12, seed=12), masks(9)[1]
    torch.testing.assert_close(twin(x), module(x))
    assert (twin(x, mask=keep) - module(x, mask=keep))[1].abs().max() > 1e-3


# -- 7. packed sequences, and the dense causal RoPE layer ----------------------------------------

CU_SEQLENS = torch.tensor([0, 3, 3, 5, 9], dtype=torch.int32)  # lengths 3, 0 (empty), 2, 4
BOUNDS = ((0, 3), (3, 5), (5, 9))


def packed_oracle(m, x):
    positions = torch.cat([torch.arange(end - start) for start, end in BOUNDS])
    segment = torch.cat([torch.full((end - start,), i) for i, (start, end) in enumerate(BOUNDS)])
    q, k, v = (heads(t[None], m.num_heads)
               for t in linear(x, m.Wqkv).chunk(3, dim=-1))  # (1, H, T, d)
    q, k = rope(q, positions), rope(k, positions)
    allowed = causal(x.shape[0]) & (segment[:, None] == segment[None, :])
    return linear(merge(attention(q, k, v, allowed))[0], m.out_proj)


def test_packed_sequences_restart_their_positions_and_equal_each_alone():
    module = build(arch.PackedCausalRopeAttention, 12, 3)
    x = randn(9, 12, seed=13)
    packed = module(x, CU_SEQLENS, 4)
    torch.testing.assert_close(packed, packed_oracle(module, x), **LOOSE)
    for start, end in BOUNDS:
        alone = module(x[start:end], torch.tensor([0, end - start], dtype=torch.int32),
                       end - start)
        torch.testing.assert_close(packed[start:end], alone, rtol=1e-12, atol=1e-12)
    one = module(x[:1], torch.tensor([0, 1], dtype=torch.int32), 1)  # a single token
    torch.testing.assert_close(one, packed_oracle(module, x)[:1], **LOOSE)


def test_packed_twin_merges_the_sequences():
    module = build(arch.PackedCausalRopeAttention, 12, 3)
    twin = same_weights(module, arch.PackedRopePositionsNotReset, 12, 3)
    x = randn(9, 12, seed=13)
    right, wrong = module(x, CU_SEQLENS, 4), twin(x, CU_SEQLENS, 4)
    torch.testing.assert_close(wrong[:3], right[:3])  # the first sequence starts at 0 anyway
    assert (wrong[3:] - right[3:]).abs().max() > 1e-3


def test_packed_optional_offsets_are_causal_attention_per_sequence():
    module = build(arch.PackedOptionalOffsets, 12, 3)
    x = randn(9, 12, seed=14)
    packed = module(x, CU_SEQLENS, 4)
    for start, end in BOUNDS:
        q, k, v = (heads(t, 3) for t in linear(x[None, start:end], module.qkv).chunk(3, dim=-1))
        expected = linear(merge(attention(q, k, v, causal(end - start))), module.out)[0]
        torch.testing.assert_close(packed[start:end], expected)
    with pytest.raises(TypeError):
        module(x)  # no offsets: it can't run


def causal_rope_oracle(m, x, keep):
    length = x.shape[1]
    positions = torch.arange(length)
    q, k, v = (heads(t, m.num_heads) for t in linear(x, m.qkv).chunk(3, dim=-1))
    q, k = rope(q, positions), rope(k, positions)
    return linear(merge(attention(q, k, v, allowed_from(keep, length, True))), m.proj)


def test_causal_rope_attention_is_causal_rope_attention():
    module = build(arch.CausalRopeAttention, 12, 3)
    for length in LENGTHS:
        x = randn(2, length, 12, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), causal_rope_oracle(module, x, keep),
                                       **LOOSE)


def test_bfloat16_positions_twin_drifts_past_256_tokens():
    module = build(arch.CausalRopeAttention, 16, 2)
    twin = same_weights(module, arch.RopeBf16Positions, 16, 2)
    x = randn(1, 300, 16, seed=14)
    torch.testing.assert_close(twin.float()(x.float()), module.float()(x.float()),
                               rtol=1e-5, atol=1e-5)  # exact enough in float32
    expected = causal_rope_oracle(module.double(), x, None)
    right = copy.deepcopy(module).to(torch.bfloat16)(x.to(torch.bfloat16)).double()
    wrong = copy.deepcopy(twin).to(torch.bfloat16)(x.to(torch.bfloat16)).double()
    right_error = (right - expected)[:, 256:].abs().max()
    wrong_error = (wrong - expected)[:, 256:].abs().max()
    assert wrong_error > 3 * right_error


# -- every class: builds from (d_model, num_heads), runs in every dtype --------------------------

def run(module, x, keep):
    """The module's output for a batch x (B, L, D) and a keep mask (B, L) or None."""
    if isinstance(module, (arch.PackedCausalRopeAttention, arch.PackedOptionalOffsets)):
        batch, length, width = x.shape
        cu = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32)
        return module(x.reshape(batch * length, width), cu, length).reshape(batch, length, -1)
    if isinstance(module, arch.CrossAttentionWithCache):
        return module(x, x, encoder_attention_mask=keep)[0]
    return module(x, mask=keep)


SIZES = ((4, 2), (2, 2), (6, 2), (3, 3), (8, 1), (12, 4))
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@pytest.mark.parametrize("cls", [*arch.CORRECT, *arch.BROKEN], ids=lambda cls: cls.__name__)
def test_every_class_builds_and_runs_at_every_size_and_dtype(cls):
    for d_model, num_heads in SIZES:
        torch.manual_seed(0)
        module = cls(d_model, num_heads).eval()
        for dtype in DTYPES:
            typed = copy.deepcopy(module).to(dtype)
            for length in (1, 3):
                x = randn(2, length, d_model, seed=length).to(dtype)
                for keep in (None, kept(2, length, (length, 1))):
                    packed = (arch.PackedCausalRopeAttention, arch.PackedOptionalOffsets)
                    if isinstance(module, packed) and keep is not None:
                        continue
                    out = run(typed, x, keep)
                    rows = module.latents.shape[0] if hasattr(module, "latents") else length
                    assert out.shape == (2, rows, d_model) and out.dtype == dtype
                    assert torch.isfinite(out).all(), (cls.__name__, d_model, num_heads, dtype)
                    torch.testing.assert_close(run(typed, x, keep), out, rtol=0, atol=0)


def test_the_collection_says_what_each_twin_breaks():
    assert arch.STYLES is arch.CORRECT
    checks = {"padding", "fully_masked", "row_stochastic", "head_split", "causal", "reference",
              "scale", "permutation", "position_shift", "autograd", "kv_cache", "packed",
              "low_precision"}
    for cls in arch.CORRECT:
        assert cls.__doc__ and "forward(" in cls.__doc__ and "BROKEN" not in cls.__doc__
    for cls, check in arch.BROKEN.items():
        assert check in checks
        assert cls.__doc__.startswith("BROKEN twin:") and f"Caught by: {check}" in cls.__doc__
        assert any(issubclass(cls, correct) for correct in arch.CORRECT)


# -- 8. a kernel with a softmax scale and a softcap ------------------------------------------------

@pytest.mark.parametrize(("causal", "scale", "cap"), [(False, None, 0.0), (True, 0.3, 0.0),
                                                      (False, 0.7, 2.0), (True, None, 1.5)])
def test_the_softcap_kernel_is_scaled_capped_then_masked_attention(causal, scale, cap):
    q, k, v = randn(2, 3, 2, 4, seed=1), randn(2, 5, 2, 4, seed=2), randn(2, 5, 2, 4, seed=3)
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * (4 ** -0.5 if scale is None else scale)
    if cap:
        logits = cap * torch.tanh(logits / cap)
    if causal:  # bottom-right: query i is position i + 2 of 5
        allowed = torch.arange(5)[None, :] <= torch.arange(3)[:, None] + 2
        logits = logits.masked_fill(~allowed, float("-inf"))
    expected = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(logits, -1), v)
    seen = arch.softcap_kernel(q, k, v, causal=causal, sm_scale=scale, logit_softcap=cap)
    torch.testing.assert_close(seen, expected)


def test_the_softcap_kernel_twin_drops_the_scale_only_with_a_softcap():
    q, k, v = randn(1, 4, 2, 4, seed=4), randn(1, 4, 2, 4, seed=5), randn(1, 4, 2, 4, seed=6)
    twin, right = arch.softcap_kernel_scale_dropped, arch.softcap_kernel
    torch.testing.assert_close(twin(q, k, v, sm_scale=0.9), right(q, k, v, sm_scale=0.9))
    torch.testing.assert_close(twin(q, k, v, logit_softcap=2.0), right(q, k, v, logit_softcap=2.0))
    both = dict(sm_scale=2.0, logit_softcap=2.0)
    assert (twin(q, k, v, **both) - right(q, k, v, **both)).abs().max() > 1e-3
