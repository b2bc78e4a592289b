"""The modern collection is correct, proved without the suite: each module against a float64
attention written here from its own weights (grouped heads repeated per group, rotary angles,
windows, ALiBi slopes), and its cached decoding against its own full forward."""

from __future__ import annotations

import math

import pytest
import torch

from tests.fixtures import modern_styles as styles


def attention(q, k, v, allowed, bias=0.0):
    """softmax(q k^T / sqrt(d) + bias, masked to ``allowed``) v, heads (B, H, L, Dh)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v


def heads(x, linear, count):
    """(B, L, D) -> (B, count, L, Dh) through ``linear``."""
    out = linear(x)
    return out.view(*x.shape[:2], count, -1).transpose(1, 2)


def grouped(x, group):
    """Each key/value head repeated for the ``group`` query heads that read it."""
    return x.repeat_interleave(group, dim=1)


def causal(length, window=None):
    rows, cols = torch.arange(length)[:, None], torch.arange(length)[None, :]
    allowed = cols <= rows
    return allowed if window is None else allowed & (rows - cols < window)


def rotate(x, positions, pairs):
    """RoPE at ``positions`` (L,), theta 10000: pairs "half" (i, i + D/2) or "interleaved"."""
    dim = x.shape[-1]
    angles = positions[:, None].double() * 10000.0 ** (-torch.arange(0, dim, 2).double() / dim)
    cos, sin = angles.cos(), angles.sin()
    if pairs == "half":
        a, b = x[..., : dim // 2], x[..., dim // 2 :]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


def merge(out, linear):
    return linear(out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1))


X = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_nanogpt_cache_and_output():
    module = styles.NanoGPTCachedAttention(16, 4).double().eval()
    q, k, v = (t.view(2, 9, 4, 4).transpose(1, 2) for t in module.c_attn(X).split(16, dim=2))
    expected = merge(attention(q, k, v, causal(9)), module.c_proj)
    torch.testing.assert_close(module(X), expected)
    out, past = module(X[:, :4], use_cache=True)
    outputs = [out]
    for t in range(4, 9):
        out, past = module(X[:, t:t + 1], layer_past=past, use_cache=True)
        outputs.append(out)
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected)


def test_meta_llama_rope_groups_and_cache():
    module = styles.MetaLlamaCachedAttention(16, 4, n_kv_heads=2, max_batch_size=4,
                                             max_seq_len=32).double().eval()
    positions = torch.arange(9)
    q = rotate(heads(X, module.wq, 4), positions, "interleaved")
    k = rotate(heads(X, module.wk, 2), positions, "interleaved")
    v = heads(X, module.wv, 2)
    expected = merge(attention(q, grouped(k, 2), grouped(v, 2), causal(9)), module.wo)
    # complex64 rotary tables and a float32 softmax inside: float32 accuracy
    torch.testing.assert_close(module(X), expected, rtol=1e-5, atol=1e-5)
    outputs = [module(X[:, :3], start_pos=0)]
    outputs += [module(X[:, t:t + 2], start_pos=t) for t in range(3, 9, 2)]
    torch.testing.assert_close(torch.cat(outputs, dim=1), module(X), rtol=1e-5, atol=1e-5)


def test_mistral_window_rope_groups_and_cache():
    module = styles.MistralStyleAttention(16, 4, num_key_value_heads=1,
                                          sliding_window=3).double().eval()
    positions = torch.arange(9)
    q = rotate(heads(X, module.q_proj, 4), positions, "half")
    k = rotate(heads(X, module.k_proj, 1), positions, "half")
    v = heads(X, module.v_proj, 1)
    expected = merge(attention(q, grouped(k, 4), grouped(v, 4), causal(9, window=3)),
                     module.o_proj)
    torch.testing.assert_close(module(X)[0], expected, rtol=1e-6, atol=1e-6)  # float32 softmax
    out, _, past = module(X[:, :2], use_cache=True)
    outputs = [out]
    for t in range(2, 9):
        out, _, past = module(X[:, t:t + 1], past_key_value=past, use_cache=True)
        outputs.append(out)
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected, rtol=1e-6, atol=1e-6)


def test_local_attention_counts_the_keys_before_the_row():
    module = styles.LocalCausalAttention(16, heads=4, window_size=2).double().eval()
    q, k, v = (t.view(2, 9, 4, 4).transpose(1, 2) for t in module.to_qkv(X).chunk(3, dim=-1))
    expected = merge(attention(q, k, v, causal(9, window=3)), module.to_out)  # 2 before + itself
    torch.testing.assert_close(module(X), expected)


def test_mpt_alibi_is_a_distance_penalty_with_its_slopes():
    module = styles.MPTAlibiAttention(16, 4).double().eval()
    q, k, v = (t.view(2, 9, 4, 4).transpose(1, 2) for t in module.Wqkv(X).chunk(3, dim=2))
    slopes = torch.tensor([2.0 ** (-8 * (h + 1) / 4) for h in range(4)],  # the paper's, 4 heads
                          dtype=torch.float64)
    distance = torch.arange(9)[:, None] - torch.arange(9)[None, :]
    bias = -slopes[:, None, None] * distance
    expected = merge(attention(q, k, v, causal(9), bias), module.out_proj)
    torch.testing.assert_close(module(X), expected)

    def paper_slopes(n):  # the ALiBi paper's get_slopes
        def power_of_2(n):
            start = 2 ** (-(2 ** -(math.log2(n) - 3)))
            return [start * start**i for i in range(n)]
        if math.log2(n).is_integer():
            return power_of_2(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]

    for n in range(1, 9):  # MPT's interleaving gives the paper's slopes at every head count
        assert styles.gen_slopes(n).tolist() == pytest.approx(paper_slopes(n), rel=1e-6)


def test_packed_sequences_equal_each_alone_and_the_reference():
    module = styles.PackedSequenceAttention(16, 4, num_key_value_heads=2).double().eval()
    single = X[:1]
    q = heads(single, module.query, 4)
    k, v = grouped(heads(single, module.key, 2), 2), grouped(heads(single, module.value, 2), 2)
    segment = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    allowed = causal(9) & (segment[:, None] == segment[None, :])
    expected = merge(attention(q, k, v, allowed), module.dense)
    cu_seqlens = torch.tensor([0, 3, 5, 9], dtype=torch.int32)
    torch.testing.assert_close(module(single, cu_seqlens=cu_seqlens, max_seqlen=4), expected)
    alone = torch.cat([module(single[:, a:b]) for a, b in ((0, 3), (3, 5), (5, 9))], dim=1)
    torch.testing.assert_close(alone, expected)


@pytest.mark.skipif(not styles.HAS_TRANSFORMERS, reason="needs transformers")
def test_hf_llama_cache_object_decoding_equals_the_full_forward():
    from transformers import DynamicCache

    module = styles.HFLlamaCachedAttention(16, 4, num_key_value_heads=2).double().eval()
    positions = torch.arange(9)
    attn = module.self_attn
    q = rotate(heads(X, attn.q_proj, 4), positions, "half")
    k = rotate(heads(X, attn.k_proj, 2), positions, "half")
    v = heads(X, attn.v_proj, 2)
    expected = merge(attention(q, grouped(k, 2), grouped(v, 2), causal(9)), attn.o_proj)
    torch.testing.assert_close(module(X), expected, rtol=1e-5, atol=1e-5)  # float32 inside HF
    cache = DynamicCache()
    outputs = [module(X[:, :5], past_key_values=cache)]
    outputs += [module(X[:, t:t + 1], past_key_values=cache) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(outputs, dim=1), expected, rtol=1e-5, atol=1e-5)
