"""Proof that every wrapper in tests/fixtures/library_transformers.py is correct attention, and that its
docstring tells the truth.

Each wrapper (module `.double()`, eval mode, every parameter redrawn at random so that biases, norm weights
and GPT-2's zero-initialised Conv1D biases all count) is compared with a float64 oracle written here from
scratch: the layer's own weights are read by their library names and split per head (separate, fused
[q; k; v], per-head interleaved [q_h; k_h; v_h], per-group [q_g..; k_g; v_g], transposed Conv1D), and
softmax(q k^T / sqrt(d) + bias) v is computed with einsum and an explicit max-subtracted softmax, with this
file's own rotary embedding (half-split or interleaved pairing, rotated width and theta from the wrapper's
arguments), its own ALiBi (slopes from the paper's formula, positions counted in kept tokens), its own q/k
RMSNorm, its own key/value grouping (query head h reads key/value head h // (H / Hkv)), causal triangle and
window. With a padding mask only the rows of kept query positions are compared (what a layer outputs at a
padded query is unspecified).

Wrappers whose library computes a part in float32 inside a float64 run are compared at a float32 tolerance;
two tests prove that exactly the documented parts are float32: a dtype-recording TorchFunctionMode lists the
library functions that produce float32 tensors in a float64 run (and nothing else does), and with every
float32 request turned into float64 each such wrapper agrees with the oracle at 1e-10. Float32 runs agree
at 1e-4. Then one test per documented quirk: 4-D masks replace causality, BLOOM counts positions in kept
tokens and refuses 4-D masks, a 2-D additive mask is read backwards, packed-sequence detection from
position_ids, Mistral's window, the RoPE width constraints, the grouping conventions, the returned tuples,
and why every wrapper sets `_attn_implementation` (a bare config gives no mask at all).

Nothing here uses the project's conformance package.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

pytest.importorskip("transformers")

from torch.overrides import TorchFunctionMode

from tests.fixtures import library_transformers as T

E = 24  # model width
SHAPES = [(2, 5), (3, 7), (1, 9)]  # (B, L), B != L
F64 = {"rtol": 1e-10, "atol": 1e-12}
# A float32 part inside a float64 run (each spec names it; test_float32_parts_* prove it): float32 RoPE
# tables, float32 softmax probabilities, float32-rounded q/k give output errors up to 1.2e-6 (GPT-J; 4e-7 to
# 8e-7 for the others) on outputs up to about 10 (measured), against 3e-15 for the all-float64 wrappers.
F32_PARTS = {"rtol": 1e-5, "atol": 2e-6}
F32_RUN = {"rtol": 1e-4, "atol": 5e-5}
NEG = float("-inf")


# ---------------------------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------------------------
def project(x, weight, bias, heads):
    """x (B, L, Din) through an nn.Linear-shaped (heads * d, Din) weight -> (B, heads, L, d), float64."""
    w = weight.detach().double().reshape(heads, -1, weight.shape[-1])
    out = torch.einsum("bld,hkd->bhlk", x.double(), w)
    if bias is not None:
        out = out + bias.detach().double().reshape(heads, 1, -1)
    return out


def rope(x, pos, r, theta, pairing):
    """Rotary embedding of x (B, H, L, D) at positions pos ((L) or (B, L)). Frequencies theta ** (-2i / r)
    for i < ceil(r / 2); the first 2 * ceil(r / 2) dimensions rotate, the rest pass. pairing "half": i with
    i + ceil(r / 2) inside the rotated block; "interleaved": 2i with 2i + 1."""
    freqs = float(theta) ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    n = freqs.numel()
    angle = pos.double()[..., None] * freqs  # (L, n) or (B, L, n)
    if angle.dim() == 3:
        angle = angle[:, None]
    cos, sin = angle.cos(), angle.sin()
    rot, rest = x[..., : 2 * n], x[..., 2 * n:]
    if pairing == "half":
        a, b = rot[..., :n], rot[..., n:]
        rot = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
        rot = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([rot, rest], dim=-1)


def alibi_slopes(n):
    """The ALiBi paper's slopes: 2 ** (-8k / m), k = 1..m, for m = 2 ** floor(log2 n); then the odd-k slopes
    of 2m, as many as are missing."""
    m = 2 ** math.floor(math.log2(n))
    own = [2.0 ** (-8.0 * k / m) for k in range(1, m + 1)]
    extra = [2.0 ** (-8.0 * k / (2 * m)) for k in range(1, 2 * m + 1, 2)]
    return torch.tensor(own + extra[: n - m], dtype=torch.float64)


def kept_positions(keep):
    """Position of each key counted in kept tokens: 0 for the first kept one; 0 at padding."""
    k = keep.long()
    return (k.cumsum(-1) - 1) * k


def rms(x, weight, eps):
    x = x / torch.sqrt(x.square().mean(-1, keepdim=True) + eps)
    return x * weight.detach().double()


def attention(q, k, v, allowed=None, bias=None):
    """q (B, H, L, d), k and v (B, Hkv, L, d) -> (B, L, H * d); query head h reads key/value head
    h // (H / Hkv). allowed: bool, True = may attend; bias: additive; both broadcast to (B, H, L, L)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    reads = torch.arange(heads) // (heads // kv_heads)
    k, v = k[:, reads], v[:, reads]
    s = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = s.masked_fill(~allowed, NEG)
    s = s - s.amax(dim=-1, keepdim=True)
    p = s.exp()
    p = p / p.sum(dim=-1, keepdim=True)
    return torch.einsum("bhij,bhjd->bihd", p, v).flatten(2)


def visible(keep, n, causal, window=None, segments=None):
    """(B or 1, 1, n, n) visibility from kept keys (B, n) or None, causality, a window (query i sees key j
    iff i - window < j <= i) and packed segments (B, n)."""
    a = torch.ones(1, 1, n, n, dtype=torch.bool)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    if keep is not None:
        a = a & keep.bool()[:, None, None, :]
    if causal:
        a = a & (j <= i)
    if window is not None:
        a = a & (j > i - window)
    if segments is not None:
        a = a & (segments[:, None, :, None] == segments[:, None, None, :])
    return a


# ---------------------------------------------------------------------------------------------
# The layers' weights, read by their library names, as {"q"|"k"|"v"|"o": (nn.Linear-shaped weight, bias)}
# ---------------------------------------------------------------------------------------------
def lin(layer):
    return layer.weight, layer.bias


def separate(attn, q="q_proj", k="k_proj", v="v_proj", o="o_proj"):
    return {"q": lin(getattr(attn, q)), "k": lin(getattr(attn, k)), "v": lin(getattr(attn, v)),
            "o": None if o is None else lin(getattr(attn, o))}


def fused_blocks(layer, heads, kv_heads, o):
    """[q (H d); k (Hkv d); v (Hkv d)] rows (Phi-3 qkv_proj, Falcon-7B multi-query)."""
    d = o.weight.shape[1] // heads
    cuts = [heads * d, kv_heads * d, kv_heads * d]
    ws = layer.weight.split(cuts)
    bs = (None,) * 3 if layer.bias is None else layer.bias.split(cuts)
    return {"q": (ws[0], bs[0]), "k": (ws[1], bs[1]), "v": (ws[2], bs[2]), "o": lin(o)}


def per_head_interleaved(layer, heads, o):
    """[q_0; k_0; v_0; q_1; ...] rows, d each (GPT-NeoX, BLOOM query_key_value)."""
    w = layer.weight.reshape(heads, 3, -1, layer.weight.shape[-1])
    b = layer.bias.reshape(heads, 3, -1)
    return {n: (w[:, i].flatten(0, 1), b[:, i].flatten()) for i, n in enumerate("qkv")} | {"o": lin(o)}


def per_group(layer, heads, kv_heads, o):
    """Falcon-40B: per group g, [q_{gG}..q_{gG+G-1}; k_g; v_g] rows, d each; no biases."""
    g = heads // kv_heads
    w = layer.weight.reshape(kv_heads, g + 2, -1, layer.weight.shape[-1])
    return {"q": (w[:, :g].flatten(0, 2), None), "k": (w[:, g].flatten(0, 1), None),
            "v": (w[:, g + 1].flatten(0, 1), None), "o": lin(o)}


def conv1d(attn):
    """GPT-2: Conv1D weights are (in, out), y = x @ W + b: transposed to nn.Linear's (out, in)."""
    ws = attn.c_attn.weight.T.chunk(3)
    bs = attn.c_attn.bias.chunk(3)
    return {"q": (ws[0], bs[0]), "k": (ws[1], bs[1]), "v": (ws[2], bs[2]),
            "o": (attn.c_proj.weight.T, attn.c_proj.bias)}


# ---------------------------------------------------------------------------------------------
# Per wrapper. cfg: (heads, kv_heads or None, extra). build(cfg) -> module; params(m, H, Hkv) -> P;
# rope(cfg) -> (pairing, rotated width r, theta); window(cfg); causal; tol; returns_tuple; positions (the
# forward takes position_ids).
# ---------------------------------------------------------------------------------------------
def llama_like(cls, configs, tol=F32_PARTS, params=None, rope_fn=None, build=None, **extra):
    return dict(
        build=build or (lambda c: cls(E, c[0], num_key_value_heads=c[1])),
        configs=configs,
        params=params or (lambda m, h, kv: separate(m.self_attn)),
        rope=rope_fn or (lambda c: ("half", E // c[0], 10000.0)),
        causal=True, tol=tol, positions=True, **extra,
    )


# heads 5 below: head_dim 4 and inner width 20 < 24, for the layers whose config does not check the width.
SPECS = {
    # float32 parts: RoPE tables (LlamaRotaryEmbedding.forward) and the eager softmax.
    # cfg (heads, kv_heads, attention_bias, rope_theta)
    T.LlamaSelfAttention: llama_like(
        T.LlamaSelfAttention,
        [(4, None, False, 1e4), (4, 2, False, 1e4), (6, 3, True, 500.0), (2, 1, False, 1e4),
         (1, None, True, 1e4)],
        build=lambda c: T.LlamaSelfAttention(E, c[0], num_key_value_heads=c[1], attention_bias=c[2],
                                             rope_theta=c[3]),
        rope_fn=lambda c: ("half", E // c[0], c[3])),
    # float32 parts: RoPE tables and the softmax.
    T.MistralSlidingWindowAttention: dict(
        build=lambda c: T.MistralSlidingWindowAttention(E, c[0], num_key_value_heads=c[1],
                                                        sliding_window=c[2]),
        configs=[(4, 2, 4), (2, None, 1), (6, 3, 3), (3, 1, 2), (5, None, 3)],
        params=lambda m, h, kv: separate(m.self_attn), rope=lambda c: ("half", E // c[0], 10000.0),
        window=lambda c: c[2], causal=True, tol=F32_PARTS, positions=True,
    ),
    # float32 part: RoPE tables only (SDPA runs in float64).
    T.Qwen2SdpaAttention: llama_like(T.Qwen2SdpaAttention, [(4, 2), (2, 1), (6, 3), (3, None), (5, None)]),
    # float32 parts: RoPE tables and the softmax.
    T.GemmaSelfAttention: llama_like(T.GemmaSelfAttention, [(4, 2), (3, None), (6, 1), (5, None)],
                                     returns_tuple=True),
    # float32 parts: RoPE tables and the softmax.
    T.Phi3FusedQKVAttention: llama_like(
        T.Phi3FusedQKVAttention, [(4, 2), (3, None), (6, 2), (2, 1), (5, None)],
        params=lambda m, h, kv: fused_blocks(m.self_attn.qkv_proj, h, kv, m.self_attn.o_proj)),
    # float32 parts: RoPE tables and the softmax. head_dim 6, 12, 24, 8, 3 -> r = 1 (2 dims rotate), 3 (4
    # rotate), 6, 2, 0 (none); with rotary_pct 0.5: head_dim 12 -> r = 6.
    T.GPTNeoXPartialRotaryAttention: dict(
        build=lambda c: T.GPTNeoXPartialRotaryAttention(E, c[0], rotary_pct=c[2]),
        configs=[(4, None, 0.25), (2, None, 0.25), (1, None, 0.25), (3, None, 0.25), (8, None, 0.25),
                 (2, None, 0.5)],
        params=lambda m, h, kv: per_head_interleaved(m.attention.query_key_value, h, m.attention.dense),
        rope=lambda c: ("half", int((E // c[0]) * c[2]), 10000.0),
        causal=True, tol=F32_PARTS, positions=True,
    ),
    # float32 part: RoPE tables only (Falcon's eager softmax runs in the input dtype).
    T.Falcon7BMultiQueryAttention: dict(
        build=lambda c: T.Falcon7BMultiQueryAttention(E, c[0]),
        configs=[(4, 1), (2, 1), (6, 1), (1, 1)],
        params=lambda m, h, kv: fused_blocks(m.self_attention.query_key_value, h, 1, m.self_attention.dense),
        rope=lambda c: ("half", E // c[0], 10000.0), causal=True, tol=F32_PARTS, positions=True,
    ),
    # float32 part: RoPE tables only.
    T.Falcon40BGroupedAttention: dict(
        build=lambda c: T.Falcon40BGroupedAttention(E, c[0], num_kv_heads=c[1]),
        configs=[(4, 2), (6, 3), (6, 1), (2, None)],
        params=lambda m, h, kv: per_group(m.self_attention.query_key_value, h, kv, m.self_attention.dense),
        rope=lambda c: ("half", E // c[0], 10000.0), causal=True, tol=F32_PARTS, positions=True,
    ),
    # the ALiBi tensor built from float32 slopes in bfloat16 (exact for these heads and lengths: each
    # slope is a power of two, each position fits 8 bits), added before the 1/sqrt(d) scaling.
    T.FalconRWAlibiAttention: dict(
        build=lambda c: T.FalconRWAlibiAttention(E, c[0]),
        configs=[(1,), (3,), (4,), (6,), (8,)],
        params=lambda m, h, kv: per_head_interleaved(m.self_attention.query_key_value, h,
                                                     m.self_attention.dense),
        alibi=True, alibi_before_scaling=True, causal=True, tol=F64,
    ),
    # float32 parts: the ALiBi tensor (float32 slopes and product) and the softmax.
    T.BloomAlibiAttention: dict(
        build=lambda c: T.BloomAlibiAttention(E, c[0]),
        configs=[(1,), (3,), (4,), (6,), (8,)],
        params=lambda m, h, kv: per_head_interleaved(m.self_attention.query_key_value, h,
                                                     m.self_attention.dense),
        alibi=True, causal=True, tol=F32_PARTS,
    ),
    # all float64 (SDPA).
    T.GPT2Conv1DAttention: dict(
        build=lambda c: T.GPT2Conv1DAttention(E, c[0]), configs=[(1,), (3,), (4,), (8,)],
        params=lambda m, h, kv: conv1d(m.attn), causal=True, tol=F64,
    ),
    # all float64 (SDPA); no output projection.
    T.BertEncoderSelfAttention: dict(
        build=lambda c: T.BertEncoderSelfAttention(E, c[0]), configs=[(1,), (3,), (4,), (8,)],
        params=lambda m, h, kv: separate(m.attention, "query", "key", "value", None), causal=False, tol=F64,
    ),
    # all float64 (eager softmax in the input dtype).
    T.WhisperEncoderSelfAttention: dict(
        build=lambda c: T.WhisperEncoderSelfAttention(E, c[0]), configs=[(1,), (3,), (4,), (8,)],
        params=lambda m, h, kv: separate(m.self_attn, o="out_proj"), causal=False, tol=F64,
    ),
    T.WhisperDecoderSelfAttention: dict(
        build=lambda c: T.WhisperDecoderSelfAttention(E, c[0]), configs=[(1,), (3,), (4,), (8,)],
        params=lambda m, h, kv: separate(m.self_attn, o="out_proj"), causal=True, tol=F64,
    ),
    # float32 parts: the sin/cos table and q.k (q and k cast to float32).
    T.GPTJInterleavedRotaryAttention: dict(
        build=lambda c: T.GPTJInterleavedRotaryAttention(E, c[0], rotary_dim=c[2]),
        configs=[(4, None, 4), (2, None, 4), (6, None, 4), (3, None, 6), (1, None, 24)],
        params=lambda m, h, kv: separate(m.attn, o="out_proj"),
        rope=lambda c: ("interleaved", c[2], 10000.0), causal=True, tol=F32_PARTS, positions=True,
    ),
    # float32 parts: RoPE tables and the softmax. head_dim 8, 24 with factor 0.25 -> r = 2, 6; head_dim 12, 4
    # with factor 0.5 -> r = 6, 2.
    T.StableLmPartialRotaryAttention: dict(
        build=lambda c: T.StableLmPartialRotaryAttention(E, c[0], num_key_value_heads=c[1],
                                                         partial_rotary_factor=c[2]),
        configs=[(3, None, 0.25), (1, None, 0.25), (3, 1, 0.25), (2, 1, 0.5), (6, 3, 0.5)],
        params=lambda m, h, kv: separate(m.self_attn),
        rope=lambda c: ("half", int((E // c[0]) * c[2]), 10000.0), causal=True, tol=F32_PARTS, positions=True,
    ),
    # float32 part: the softmax.
    T.OPTDecoderSelfAttention: dict(
        build=lambda c: T.OPTDecoderSelfAttention(E, c[0]), configs=[(1,), (3,), (4,), (8,)],
        params=lambda m, h, kv: separate(m.self_attn, o="out_proj"), causal=True, tol=F32_PARTS,
        returns_tuple=True,
    ),
    # float32 parts: RoPE tables and the softmax.
    T.Starcoder2SelfAttention: dict(
        build=lambda c: T.Starcoder2SelfAttention(E, c[0], num_key_value_heads=c[1], sliding_window=c[2]),
        configs=[(4, 2, None), (3, None, None), (6, 2, 3), (2, 1, 2), (5, None, None)],
        params=lambda m, h, kv: separate(m.self_attn), rope=lambda c: ("half", E // c[0], 10000.0),
        window=lambda c: c[2], causal=True, tol=F32_PARTS, positions=True,
    ),
    # float32 parts: RoPE tables, the rotation (q, k cast to float32) and the softmax.
    T.CohereInterleavedRotaryAttention: llama_like(
        T.CohereInterleavedRotaryAttention, [(4, 2), (3, None), (6, 1), (2, None), (5, None)],
        rope_fn=lambda c: ("interleaved", E // c[0], 10000.0)),
    # float32 parts: the q/k RMSNorm, RoPE tables and the softmax.
    T.Qwen3QKNormAttention: llama_like(
        T.Qwen3QKNormAttention, [(4, 2), (3, None), (6, 2), (2, 1), (5, None)],
        qk_norm=lambda m: (m.self_attn.q_norm.weight, m.self_attn.k_norm.weight, 1e-6)),
}
LAYERS = list(SPECS)
IDS = [c.__name__ for c in LAYERS]
F32_LAYERS = [c for c in LAYERS if SPECS[c]["tol"] is F32_PARTS]


def heads_of(cfg):
    return cfg[0], (cfg[1] if len(cfg) > 1 and cfg[1] is not None else cfg[0])


def randomize(m, seed=123):
    """Every parameter redrawn: weights N(0, 0.3^2), norm weights 1 + N(0, 0.3^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + 0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64))
    return m


def build(spec, cfg, dtype=torch.float64):
    torch.manual_seed(0)
    return randomize(spec["build"](cfg)).to(dtype).eval()


def randn(*shape, gen, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def padding(b, n, gen):
    """Kept keys (B, n): key 0 kept, key 1 masked before the kept key 2, the rest scattered."""
    keep = torch.rand(b, n, generator=gen) < 0.6
    keep[:, 0] = True
    if n >= 3:
        keep[:, 1], keep[:, 2] = False, True
    return keep


def call(spec, m, x, keep=None, **kw):
    """The wrapper with the tokenizer's (B, L) 1/0 mask; the output tensor (from the tuple where the wrapper
    returns the library's tuple)."""
    out = m(x, **kw) if keep is None else m(x, attention_mask=keep.long(), **kw)
    if spec.get("returns_tuple"):
        assert isinstance(out, tuple) and len(out) == 2
        out = out[0]
    return out


def want(spec, m, cfg, x, keep=None, pos=None, causal=None, segments=None, bias=None):
    """The oracle for wrapper m built from cfg on x with kept keys keep (B, L), positions pos, and an extra
    additive bias."""
    heads, kv_heads = heads_of(cfg)
    b, n, _ = x.shape
    P = spec["params"](m, heads, kv_heads)
    q, k, v = (project(x, *P[name], h) for name, h in (("q", heads), ("k", kv_heads), ("v", kv_heads)))
    if spec.get("qk_norm"):
        wq, wk, eps = spec["qk_norm"](m)
        q, k = rms(q, wq, eps), rms(k, wk, eps)
    if spec.get("rope"):
        pairing, r, theta = spec["rope"](cfg)
        p = torch.arange(n) if pos is None else pos
        q, k = rope(q, p, r, theta, pairing), rope(k, p, r, theta, pairing)
    if spec.get("qk_map"):  # a quirk test's stand-in for what the library does instead of RoPE
        q, k = spec["qk_map"](q), spec["qk_map"](k)
    if spec.get("alibi"):
        p = kept_positions(torch.ones(b, n) if keep is None else keep)
        bias = alibi_slopes(heads)[None, :, None, None] * p[:, None, None, :].double()
        if spec.get("alibi_before_scaling"):  # (q k^T + alibi) / sqrt(d)
            bias = bias / math.sqrt(E // heads)
    causal = spec["causal"] if causal is None else causal
    window = spec["window"](cfg) if "window" in spec else None
    out = attention(q, k, v, allowed=visible(keep, n, causal, window, segments), bias=bias)
    if P["o"] is not None:
        w, bo = P["o"]
        out = out @ w.detach().double().T
        out = out if bo is None else out + bo.detach().double()
    return out


# ---------------------------------------------------------------------------------------------
# Agreement with the oracle
# ---------------------------------------------------------------------------------------------
def test_registry_covers_the_collection():
    assert set(LAYERS) == set(T.LAYERS) and len(T.LAYERS) == 20
    for cls in T.LAYERS:
        assert issubclass(cls, torch.nn.Module)
        assert cls.__doc__ and len(cls.__doc__) > 600, cls.__name__


@pytest.mark.parametrize("cls", LAYERS, ids=IDS)
def test_matches_oracle_without_and_with_padding(cls):
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for cfg in spec["configs"]:
            m = build(spec, cfg)
            for b, n in SHAPES:
                x = randn(b, n, E, gen=gen)
                got = call(spec, m, x)
                assert got.shape == (b, n, E) and got.dtype == torch.float64
                torch.testing.assert_close(got, want(spec, m, cfg, x), **spec["tol"])
                keep = padding(b, n, gen)
                got = call(spec, m, x, keep)[keep]  # rows of kept queries only
                torch.testing.assert_close(got, want(spec, m, cfg, x, keep)[keep], **spec["tol"])


@pytest.mark.parametrize("cls", LAYERS, ids=IDS)
def test_float32_agrees_with_the_float64_oracle(cls):
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for cfg in spec["configs"][:2]:
            m = build(spec, cfg, dtype=torch.float32)
            b, n = 3, 7
            x = randn(b, n, E, gen=gen, dtype=torch.float32)
            got = call(spec, m, x)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want(spec, m, cfg, x), **F32_RUN)
            keep = padding(b, n, gen)
            got = call(spec, m, x, keep)[keep].double()
            torch.testing.assert_close(got, want(spec, m, cfg, x, keep)[keep], **F32_RUN)


POSITIONED = [c for c in LAYERS if SPECS[c].get("positions")]


@pytest.mark.parametrize("cls", POSITIONED, ids=[c.__name__ for c in POSITIONED])
def test_position_ids_are_passed_through(cls):
    """Without a mask, per-row offsets (consecutive, so that no packed sequences are detected; RoPE being
    relative, the output does not change); with a padding mask, arbitrary positions (it does)."""
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(4)
    cfg = spec["configs"][0]
    b, n = 3, 6
    with torch.no_grad():
        m = build(spec, cfg)
        x = randn(b, n, E, gen=gen)
        pos = torch.randint(0, 40, (b, 1), generator=gen) + torch.arange(n)
        got = call(spec, m, x, position_ids=pos)
        torch.testing.assert_close(got, want(spec, m, cfg, x, pos=pos), **spec["tol"])
        keep = padding(b, n, gen)
        pos = torch.randint(0, 40, (b, n), generator=gen)
        got = call(spec, m, x, keep, position_ids=pos)[keep]
        torch.testing.assert_close(got, want(spec, m, cfg, x, keep, pos=pos)[keep], **spec["tol"])
        assert not torch.allclose(got, call(spec, m, x, keep)[keep])


# ---------------------------------------------------------------------------------------------
# The float32 parts are exactly the documented ones
# ---------------------------------------------------------------------------------------------
TORCH_DIR = os.path.dirname(torch.__file__)


def _caller():
    """Qualified name of the first frame outside torch and this file: the library function that asked."""
    frame = sys._getframe(2)
    while frame.f_code.co_filename.startswith(TORCH_DIR) or frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame.f_code.co_qualname


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)


def _f64(a):
    return torch.float64 if a is torch.float32 else a


class Float32Watch(TorchFunctionMode):
    """Records the library functions in which float32 arises: a torch call that returns a float32 tensor
    while none of its tensor arguments is float32 (a cast, a float32 factory, a float32 softmax), not the
    calls that merely carry float32 on. With promote=True, every float32 request (a dtype argument,
    Tensor.float(), .to(torch.float32)) asks for float64 instead."""

    def __init__(self, promote=False):
        super().__init__()
        self.promote, self.where = promote, set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.promote:
            func = torch.Tensor.double if func is torch.Tensor.float else func
            args = tuple(_f64(a) for a in args)
            kwargs = {k: _f64(v) for k, v in kwargs.items()}
        out = func(*args, **kwargs)
        if any(t.dtype == torch.float32 for t in _tensors(out)) and not any(
                t.dtype == torch.float32 for t in _tensors([*args, *kwargs.values()])):
            self.where.add(_caller())
        return out


class default_dtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __enter__(self):
        self.saved = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc):
        torch.set_default_dtype(self.saved)


ROPE = {"RotaryEmbedding.compute_default_rope_parameters", "RotaryEmbedding.forward"}
SOFTMAX = {"eager_attention_forward"}
FLOAT32_SITES = {  # the class-name prefix of the rotary module is dropped below
    T.LlamaSelfAttention: ROPE | SOFTMAX,
    T.MistralSlidingWindowAttention: ROPE | SOFTMAX,
    T.Qwen2SdpaAttention: ROPE,
    T.GemmaSelfAttention: ROPE | SOFTMAX,
    T.Phi3FusedQKVAttention: ROPE | SOFTMAX,
    T.GPTNeoXPartialRotaryAttention: ROPE | SOFTMAX,
    T.Falcon7BMultiQueryAttention: ROPE,
    T.Falcon40BGroupedAttention: ROPE,
    # the slopes' base and powers, in float32 before the bfloat16 product (build_alibi_tensor)
    T.FalconRWAlibiAttention: {"build_alibi_tensor"},
    # the float32 slopes (_get_alibi_slopes; build_alibi_tensor multiplies them by the positions in float32)
    # and the softmax (in forward)
    T.BloomAlibiAttention: {"_get_alibi_slopes", "BloomAttention.forward"},
    T.GPT2Conv1DAttention: set(),
    T.BertEncoderSelfAttention: set(),
    T.WhisperEncoderSelfAttention: set(),
    T.WhisperDecoderSelfAttention: set(),
    # the sin/cos table (constructor) and q.k in float32 (_attn)
    T.GPTJInterleavedRotaryAttention: {"create_sinusoidal_positions", "GPTJAttention._attn"},
    T.StableLmPartialRotaryAttention: ROPE | SOFTMAX,
    T.OPTDecoderSelfAttention: SOFTMAX,
    T.Starcoder2SelfAttention: ROPE | SOFTMAX,
    # RoPE tables, and apply_rotary_pos_emb rotates q and k in float32
    T.CohereInterleavedRotaryAttention: ROPE | SOFTMAX | {"apply_rotary_pos_emb"},
    # RMSNorm on q and k in float32
    T.Qwen3QKNormAttention: ROPE | SOFTMAX | {"Qwen3RMSNorm.forward"},
}


def _site(qualname):
    head, _, tail = qualname.partition(".")
    return "RotaryEmbedding." + tail if head.endswith("RotaryEmbedding") else qualname


@pytest.mark.parametrize("cls", LAYERS, ids=IDS)
def test_float32_parts_are_exactly_the_documented_ones(cls):
    """Building and running each wrapper in float64 under a dtype-recording mode: float32 arises exactly in
    the documented library functions (the float64 wrappers: nowhere). The wrapper is built with float64 as
    the default dtype, so that its parameters are not float32 to begin with (explicit float32 requests in
    constructors, such as the rotary frequencies, still show), and run with the usual float32 default."""
    spec = SPECS[cls]
    cfg = spec["configs"][0]
    gen = torch.Generator().manual_seed(5)
    x, keep = randn(2, 6, E, gen=gen), padding(2, 6, gen)
    with torch.no_grad(), Float32Watch() as watch:
        with default_dtype(torch.float64):
            m = build(spec, cfg)
        call(spec, m, x)
        call(spec, m, x, keep)
    assert {_site(w) for w in watch.where} == FLOAT32_SITES[cls]


@pytest.mark.parametrize("cls", F32_LAYERS, ids=[c.__name__ for c in F32_LAYERS])
def test_float32_parts_are_the_only_inexact_ones(cls):
    """With every float32 request turned into float64 (and float64 as the default dtype, for GPT-J's int / int
    frequencies) each float32-tolerance wrapper agrees with the oracle at 1e-10 and no float32 tensor
    arises; as it stands it does not agree at 1e-12."""
    spec = SPECS[cls]
    cfg = spec["configs"][1]
    gen = torch.Generator().manual_seed(6)
    b, n = 3, 7
    x, keep = randn(b, n, E, gen=gen), padding(b, n, gen)
    with torch.no_grad():
        m = build(spec, cfg)
        plain = call(spec, m, x, keep)[keep]
        with default_dtype(torch.float64), Float32Watch(promote=True) as watch:
            m = build(spec, cfg)
            exact = call(spec, m, x, keep)[keep]
        assert watch.where == set()
        expected = want(spec, m, cfg, x, keep)[keep]
        torch.testing.assert_close(exact, expected, **F64)
        assert (plain - expected).abs().max() > 1e-12


# ---------------------------------------------------------------------------------------------
# The documented quirks
# ---------------------------------------------------------------------------------------------
CAUSAL_4D = [c for c in LAYERS if SPECS[c]["causal"]
             and c not in (T.BloomAlibiAttention, T.FalconRWAlibiAttention)]


@pytest.mark.parametrize("cls", CAUSAL_4D, ids=[c.__name__ for c in CAUSAL_4D])
def test_a_4d_mask_is_the_whole_mask(cls):
    """A 4-D mask of all ones (additive: the same shift on every score) drops causality and the window; a 4-D
    additive mask carrying causality and padding gives the causal oracle. A bool 4-D mask (True = attend)
    works the same on the SDPA wrappers; the eager ones add it to the scores (+1 where True, +0 where False):
    nothing is masked."""
    spec = SPECS[cls]
    cfg = spec["configs"][0]
    gen = torch.Generator().manual_seed(7)
    b, n = 2, 6
    with torch.no_grad():
        m = build(spec, cfg)
        x = randn(b, n, E, gen=gen)
        free = dict(spec, window=lambda c: None)  # the window goes too
        everything = call(spec, m, x, None, attention_mask=torch.ones(b, 1, n, n, dtype=x.dtype))
        torch.testing.assert_close(everything, want(free, m, cfg, x, causal=False), **spec["tol"])
        assert not torch.allclose(everything[:, 0], call(spec, m, x)[:, 0])
        keep = padding(b, n, gen)
        allowed = visible(keep, n, causal=True)
        additive = torch.zeros(b, 1, n, n, dtype=x.dtype).masked_fill(~allowed, torch.finfo(x.dtype).min)
        got = call(spec, m, x, None, attention_mask=additive)[keep]
        torch.testing.assert_close(got, want(free, m, cfg, x, keep)[keep], **spec["tol"])
        got = call(spec, m, x, None, attention_mask=allowed)[keep]
        if cls in SDPA:
            torch.testing.assert_close(got, want(free, m, cfg, x, keep)[keep], **spec["tol"])
        else:
            plus_one = want(free, m, cfg, x, causal=False, bias=allowed.double())[keep]
            torch.testing.assert_close(got, plus_one, **spec["tol"])


SDPA = {T.Qwen2SdpaAttention, T.GPT2Conv1DAttention, T.BertEncoderSelfAttention}


def test_sdpa_wrappers_pass_no_mask_without_padding_and_a_bool_mask_with_it():
    from transformers.masking_utils import create_bidirectional_mask, create_causal_mask

    x, keep = torch.randn(2, 5, E), padding(2, 5, torch.Generator().manual_seed(15)).long()
    for cls in SDPA:
        m = cls(E, 4)
        config = m.config
        assert config._attn_implementation == "sdpa"
        make = create_bidirectional_mask if cls is T.BertEncoderSelfAttention else create_causal_mask
        assert make(config=config, inputs_embeds=x, attention_mask=None, past_key_values=None) is None
        ones = torch.ones(2, 5, dtype=torch.long)
        assert make(config=config, inputs_embeds=x, attention_mask=ones, past_key_values=None) is None
        mask = make(config=config, inputs_embeds=x, attention_mask=keep, past_key_values=None)
        assert mask.dtype == torch.bool and mask.shape == (2, 1, 5, 5)
        causal = cls is not T.BertEncoderSelfAttention
        torch.testing.assert_close(mask, visible(keep, 5, causal).expand(2, 1, 5, 5))
    for cls in set(LAYERS) - SDPA:
        assert cls(E, 4).config._attn_implementation == "eager", cls.__name__


def test_bloom_counts_positions_in_kept_tokens_and_refuses_4d_masks():
    spec = SPECS[T.BloomAlibiAttention]
    gen = torch.Generator().manual_seed(8)
    b, n, cfg = 2, 7, (4,)
    with torch.no_grad():
        m = build(spec, cfg)
        x, keep = randn(b, n, E, gen=gen), padding(b, n, gen)
        got = call(spec, m, x, keep)[keep]
        torch.testing.assert_close(got, want(spec, m, cfg, x, keep)[keep], **F32_PARTS)
        # positions by index (0..L-1) instead of kept-token counts: a different answer
        slopes = alibi_slopes(4)[None, :, None, None]
        P = spec["params"](m, 4, 4)
        q, k, v = (project(x, *P[name], 4) for name in "qkv")
        by_index = attention(q, k, v, allowed=visible(keep, n, True), bias=slopes * torch.arange(n).double())
        by_index = by_index @ P["o"][0].double().T + P["o"][1].double()
        assert (by_index[keep] - got).abs().max() > 1e-3
        with pytest.raises(ValueError):
            m(x, attention_mask=torch.zeros(b, 1, n, n, dtype=x.dtype))
    # the library's slopes are the paper's, stored in float32
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    for heads in range(1, 17):
        lib = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)[:, 0, 1]
        torch.testing.assert_close(lib.double(), alibi_slopes(heads), rtol=3e-7, atol=0)


def test_falcon_rw_adds_its_alibi_before_the_scaling():
    """Falcon-RW's eager attention computes (q k^T + alibi) * inv_norm_factor: the paper's bias after
    the scaling is a different answer, and the library's bias is built in bfloat16."""
    spec = SPECS[T.FalconRWAlibiAttention]
    gen = torch.Generator().manual_seed(9)
    b, n, cfg = 2, 7, (4,)
    with torch.no_grad():
        m = build(spec, cfg)
        x = randn(b, n, E, gen=gen)
        got = call(spec, m, x)
        P = spec["params"](m, 4, 4)
        q, k, v = (project(x, *P[name], 4) for name in "qkv")
        after = alibi_slopes(4)[None, :, None, None] * torch.arange(n).double()
        paper = attention(q, k, v, allowed=visible(None, n, True), bias=after)
        paper = paper @ P["o"][0].double().T + P["o"][1].double()
        assert (paper - got).abs().max() > 1e-3
        torch.testing.assert_close(got, want(spec, m, cfg, x), **F64)
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    assert build_alibi_tensor(torch.ones(1, 3, dtype=torch.long), 4, torch.float64).dtype == torch.float64
    # position 299 (9 bits) times the slope 2^-8: bfloat16 rounds it; float32 would not
    bias = build_alibi_tensor(torch.ones(1, 300, dtype=torch.long), 1, torch.float64)[0, 0, 299]
    assert float(bias) != 299 * 2.0 ** -8


SOFTMAX_IN_FLOAT32 = {c for c in LAYERS if FLOAT32_SITES[c] >= SOFTMAX} | {T.BloomAlibiAttention}


@pytest.mark.parametrize("cls", LAYERS, ids=IDS)
def test_rows_without_any_key_are_nan_in_float64_where_the_softmax_is_float32(cls):
    """Left padding in a causal layer (or a fully padded row) leaves query rows with no visible key; the
    float64 mask value finfo(float64).min overflows to -inf in a float32 softmax: NaN there, and only in
    float64 runs; the kept rows stay finite."""
    spec = SPECS[cls]
    keep = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    if not spec["causal"]:
        keep[0] = False  # no key at all in the first sequence
    # a causal row sees no key when no kept token is at or before it (the left padding)
    rows = keep.cumsum(-1) == 0 if spec["causal"] else torch.tensor([[True] * 6, [False] * 6])
    gen = torch.Generator().manual_seed(16)
    with torch.no_grad():
        for dtype in (torch.float64, torch.float32):
            m = build(spec, spec["configs"][0], dtype=dtype)
            out = call(spec, m, randn(2, 6, E, gen=gen, dtype=dtype), keep)
            assert out[~rows].isfinite().all()
            nan = dtype == torch.float64 and cls in SOFTMAX_IN_FLOAT32
            assert out[rows].isnan().all() if nan else out[rows].isfinite().all()


def test_a_2d_additive_mask_is_read_backwards():
    """2-D masks are cast to bool: an additive 0 / -inf mask keeps exactly the keys it meant to drop."""
    spec = SPECS[T.BertEncoderSelfAttention]
    gen = torch.Generator().manual_seed(9)
    b, n, cfg = 3, 6, (3,)
    with torch.no_grad():
        m = build(spec, cfg)
        x, keep = randn(b, n, E, gen=gen), padding(b, n, gen)
        additive = torch.zeros(b, n, dtype=x.dtype).masked_fill(~keep, NEG)
        got = m(x, attention_mask=additive)
        torch.testing.assert_close(got, want(spec, m, cfg, x, ~keep), **F64)


def test_position_ids_with_jumps_and_no_mask_are_read_as_packed_sequences():
    """create_causal_mask splits the mask where position_ids do not step by +1, unless an attention_mask is
    given (then the positions only rotate); Falcon's mask never sees the positions."""
    spec, cfg = SPECS[T.LlamaSelfAttention], (4, 2, False, 1e4)
    gen = torch.Generator().manual_seed(10)
    b, n = 2, 7
    pos = torch.tensor([0, 1, 2, 0, 1, 2, 3]).expand(b, n)
    segments = torch.tensor([0, 0, 0, 1, 1, 1, 1]).expand(b, n)
    with torch.no_grad():
        m = build(spec, cfg)
        x = randn(b, n, E, gen=gen)
        packed = m(x, position_ids=pos)
        torch.testing.assert_close(packed, want(spec, m, cfg, x, pos=pos, segments=segments), **F32_PARTS)
        whole = m(x, attention_mask=torch.ones(b, n, dtype=torch.long), position_ids=pos)
        torch.testing.assert_close(whole, want(spec, m, cfg, x, pos=pos), **F32_PARTS)
        assert not torch.allclose(packed[:, 3:], whole[:, 3:])
        # FalconModel does not hand position_ids to create_causal_mask: nothing is split there
        spec, cfg = SPECS[T.Falcon40BGroupedAttention], (4, 2)
        m = build(spec, cfg)
        torch.testing.assert_close(m(x, position_ids=pos), want(spec, m, cfg, x, pos=pos), **F32_PARTS)


def test_mistral_window_counts_the_query_itself():
    """sliding_window=w: query i sees key j iff i - w < j <= i (w keys including itself)."""
    gen = torch.Generator().manual_seed(11)
    n = 8
    with torch.no_grad():
        for w in (1, 2, 3):
            torch.manual_seed(0)
            m = randomize(T.MistralSlidingWindowAttention(E, 4, sliding_window=w)).double().eval()
            x = randn(1, n, E, gen=gen)
            before = m(x)
            for j in range(n):
                x2 = x.clone()
                x2[:, j] = 20.0 * randn(E, gen=gen)
                changed = ((m(x2) - before).abs().amax(dim=-1) > 1e-9)[0]
                assert changed.tolist() == [i - w < j <= i for i in range(n)], (w, j)


CONFIG_REFUSES_ODD = [T.LlamaSelfAttention, T.MistralSlidingWindowAttention, T.GemmaSelfAttention,
                      T.Falcon7BMultiQueryAttention, T.Falcon40BGroupedAttention, T.Qwen3QKNormAttention]
FORWARD_FAILS = [  # (wrapper, width, heads): built fine, fails in forward
    *[(cls, 24, 8) for cls in CONFIG_REFUSES_ODD],  # head_dim 3: the config lets head_dim <= 4 through
    *[(cls, w, 8 if w == 24 else 2) for cls in (T.Qwen2SdpaAttention, T.Phi3FusedQKVAttention,
                                                T.Starcoder2SelfAttention, T.CohereInterleavedRotaryAttention)
      for w in (24, 18)],  # head_dim 3 and 9: these configs do not look at head_dim
    (T.CohereInterleavedRotaryAttention, 8, 8),  # head_dim 1
    (T.StableLmPartialRotaryAttention, 24, 2),  # head_dim 12, r = 3
    (T.GPTJInterleavedRotaryAttention, 24, 8),  # head_dim 3 < rotary_dim 4
]


@pytest.mark.parametrize(("cls", "width", "heads"), FORWARD_FAILS,
                         ids=[f"{c.__name__}-{w}-{h}" for c, w, h in FORWARD_FAILS])
def test_unpairable_rotary_widths_fail_in_forward(cls, width, heads):
    m = cls(width, heads)
    with pytest.raises(RuntimeError):
        m(torch.randn(2, 5, width))


@pytest.mark.parametrize("cls", CONFIG_REFUSES_ODD, ids=[c.__name__ for c in CONFIG_REFUSES_ODD])
def test_configs_with_head_dim_refuse_an_odd_head_dim_above_4(cls):
    from huggingface_hub.errors import StrictDataclassClassValidationError

    with pytest.raises(StrictDataclassClassValidationError, match="even rotary dimension") as info:
        cls(18, 2)  # head_dim 9
    assert not isinstance(info.value, ValueError)


HEAD_DIM_1 = [*CONFIG_REFUSES_ODD, T.Qwen2SdpaAttention, T.Phi3FusedQKVAttention, T.Starcoder2SelfAttention]


def doubled(x):
    """What the half-split RoPE layers compute for head_dim 1: q (one dimension) times the 2-column cos
    table plus rotate_half(q) (= -q) times the 2-column sin table broadcasts into two equal columns
    q (cos i - sin i); scaled by 2 ** 0.25 so that the oracle's 1 / sqrt(2) leaves the library's 1 / sqrt(1).
    """
    f = (torch.arange(x.shape[-2]).double().cos() - torch.arange(x.shape[-2]).double().sin())[:, None]
    return torch.cat([x * f, x * f], dim=-1) * 2 ** 0.25


@pytest.mark.parametrize("cls", HEAD_DIM_1, ids=[c.__name__ for c in HEAD_DIM_1])
def test_head_dim_1_runs_and_is_not_rope(cls):
    """head_dim 1 (width 8, heads 8) builds and runs: score_ij = 2 q_i k_j (cos i - sin i)(cos j - sin j),
    which depends on the absolute positions, where a rotation of a lone dimension is not defined."""
    spec = SPECS[cls]
    cfg = {T.MistralSlidingWindowAttention: (8, None, 4), T.Starcoder2SelfAttention: (8, None, None),
           T.Falcon7BMultiQueryAttention: (8, 1)}.get(cls, (8, None))  # the wrappers' defaults
    gen = torch.Generator().manual_seed(14)
    with torch.no_grad():
        torch.manual_seed(0)
        m = randomize(cls(8, 8)).double().eval()
        x = randn(2, 6, 8, gen=gen)
        quirk = dict(spec, rope=None, qk_map=doubled)
        torch.testing.assert_close(call(spec, m, x), want(quirk, m, cfg, x), **F32_PARTS)


def test_rope_width_quirks():
    """GPT-NeoX rotates 2 * ceil(r / 2) dimensions (one more than rotary_pct says when r is odd) and takes an
    odd head_dim; GPT-J fails on an odd rotary_dim and on positions past max_position_embeddings."""
    gen = torch.Generator().manual_seed(12)
    m = T.GPTNeoXPartialRotaryAttention(E, 2)  # head_dim 12, r = 3
    assert m.attention.rotary_ndims == 3
    cos, _ = m.rotary_emb(torch.zeros(1, 5, E), torch.arange(5)[None])
    assert cos.shape[-1] == 4
    spec = SPECS[T.GPTNeoXPartialRotaryAttention]
    with torch.no_grad():
        torch.manual_seed(0)
        odd = randomize(T.GPTNeoXPartialRotaryAttention(18, 2)).double().eval()  # head_dim 9, r = 2
        x = randn(2, 5, 18, gen=gen)
        P = spec["params"](odd, 2, 2)
        q, k, v = (project(x, *P[name], 2) for name in "qkv")
        q, k = (rope(t, torch.arange(5), 2, 10000.0, "half") for t in (q, k))
        out = attention(q, k, v, allowed=visible(None, 5, True)) @ P["o"][0].double().T + P["o"][1].double()
        torch.testing.assert_close(odd(x), out, **F32_PARTS)
    with pytest.raises(RuntimeError):
        T.GPTJInterleavedRotaryAttention(E, 2, rotary_dim=5)(torch.randn(1, 4, E))
    short = T.GPTJInterleavedRotaryAttention(E, 2, max_position_embeddings=8)
    short(torch.randn(1, 8, E))
    with pytest.raises(RuntimeError):
        short(torch.randn(1, 9, E))


GROUPED = [(T.LlamaSelfAttention, (4, 2, False, 1e4)), (T.Qwen2SdpaAttention, (6, 2)),
           (T.Falcon40BGroupedAttention, (6, 3)), (T.StableLmPartialRotaryAttention, (6, 3, 0.5))]


@pytest.mark.parametrize(("cls", "cfg"), GROUPED, ids=[c.__name__ for c, _ in GROUPED])
def test_query_head_h_reads_key_value_head_h_over_group_size(cls, cfg):
    """The oracle's grouping (h // G) matches; the tiled one (h % Hkv) does not."""
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(13)
    x = randn(2, 6, E, gen=gen)
    with torch.no_grad():
        m = build(spec, cfg)
        got = call(spec, m, x)
        torch.testing.assert_close(got, want(spec, m, cfg, x), **spec["tol"])
        heads, kv_heads = heads_of(cfg)
        P = spec["params"](m, heads, kv_heads)
        tiled = {**P, "k": tile(P["k"], heads, kv_heads), "v": tile(P["v"], heads, kv_heads)}
        wrong = want(dict(spec, params=lambda *_: tiled), m, (heads, heads, *cfg[2:]), x)
        assert (got - wrong).abs().max() > 1e-2


GQA = [T.LlamaSelfAttention, T.MistralSlidingWindowAttention, T.Qwen2SdpaAttention, T.GemmaSelfAttention,
       T.Phi3FusedQKVAttention, T.StableLmPartialRotaryAttention, T.Starcoder2SelfAttention,
       T.CohereInterleavedRotaryAttention, T.Qwen3QKNormAttention]


@pytest.mark.parametrize("cls", [*GQA, T.Falcon40BGroupedAttention],
                         ids=[c.__name__ for c in [*GQA, T.Falcon40BGroupedAttention]])
def test_key_value_heads_that_do_not_divide_the_heads_build_and_fail_in_forward(cls):
    m = cls(E, 4, num_kv_heads=3) if cls is T.Falcon40BGroupedAttention else cls(E, 4, num_key_value_heads=3)
    with pytest.raises(RuntimeError):
        m(torch.randn(2, 5, E))


def tile(wb, heads, kv_heads):
    """Key/value weights for H heads where head h is key/value head h % Hkv."""
    w, b = wb
    w = w.reshape(kv_heads, -1, w.shape[-1])[torch.arange(heads) % kv_heads].flatten(0, 1)
    return w, None if b is None else b.reshape(kv_heads, -1)[torch.arange(heads) % kv_heads].flatten()


def test_layouts_and_returned_tuples():
    m = T.GPT2Conv1DAttention(E, 4)
    assert m.attn.c_attn.weight.shape == (E, 3 * E)  # Conv1D: (in, out)
    w = T.WhisperEncoderSelfAttention(E, 4).self_attn
    assert w.k_proj.bias is None and w.q_proj.bias is not None and w.v_proj.bias is not None
    assert T.Falcon7BMultiQueryAttention(E, 4).self_attention.query_key_value.weight.shape == (E + 2 * 6, E)
    assert T.Falcon40BGroupedAttention(E, 4, num_kv_heads=2).self_attention.query_key_value.weight.shape == (
        (4 + 2 * 2) * 6, E)
    assert T.Phi3FusedQKVAttention(E, 4, 2).self_attn.qkv_proj.weight.shape == ((4 + 2 * 2) * 6, E)
    assert T.GemmaSelfAttention(E, 5).self_attn.q_proj.weight.shape == (20, E)  # head_dim 4, inner width 20
    assert not hasattr(T.BertEncoderSelfAttention(E, 4).attention, "o_proj")
    x = torch.randn(2, 5, E)
    for cls in (T.GemmaSelfAttention, T.OPTDecoderSelfAttention):
        out, weights = cls(E, 4).eval()(x)
        assert out.shape == (2, 5, E) and weights.shape == (2, 4, 5, 5)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 5))
        assert (weights.triu(1) == 0).all()  # causal


def test_a_bare_config_gives_no_mask_at_all():
    """Why every wrapper sets `_attn_implementation`: a config used without a model class has None, the mask
    utilities then return None, and the Llama layer attends to the future and to padding. Building the model
    class is what sets "sdpa"."""
    from transformers import LlamaConfig, LlamaModel
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=E, num_attention_heads=4, num_hidden_layers=1, intermediate_size=E)
    assert config._attn_implementation is None
    x = torch.randn(2, 5, E)
    mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=torch.ones(2, 5).long(),
                              past_key_values=None)
    assert mask is None
    attn, rotary = LlamaAttention(config, layer_idx=0).eval(), LlamaRotaryEmbedding(config)
    pe = rotary(x, torch.arange(5)[None])
    x2 = x.clone()
    x2[:, -1] += 3.0
    with torch.no_grad():
        assert not torch.allclose(attn(x, pe, mask)[0][:, 0], attn(x2, pe, mask)[0][:, 0])  # not causal
    LlamaModel(config)
    assert config._attn_implementation == "sdpa"


def test_width_constraints_are_the_libraries():
    """Widths that are not a multiple of the heads: refused by the config
    (StrictDataclassClassValidationError, not a ValueError), by the attention class (ValueError), or taken
    with a smaller inner width; more heads than width: ZeroDivisionError in the constructor of the latter."""
    from huggingface_hub.errors import StrictDataclassClassValidationError

    for cls in (T.LlamaSelfAttention, T.GPTNeoXPartialRotaryAttention):
        with pytest.raises(StrictDataclassClassValidationError, match=r"multiple|divisible"):
            cls(18, 4)
    for cls in (T.Falcon7BMultiQueryAttention, T.Falcon40BGroupedAttention, T.BloomAlibiAttention,
                T.GPT2Conv1DAttention, T.BertEncoderSelfAttention, T.WhisperEncoderSelfAttention,
                T.WhisperDecoderSelfAttention, T.GPTJInterleavedRotaryAttention,
                T.StableLmPartialRotaryAttention, T.OPTDecoderSelfAttention):
        with pytest.raises(ValueError, match=r"divisible|multiple"):
            cls(18, 4)
    loose = (T.MistralSlidingWindowAttention, T.Qwen2SdpaAttention, T.GemmaSelfAttention,
             T.Phi3FusedQKVAttention, T.Starcoder2SelfAttention, T.CohereInterleavedRotaryAttention,
             T.Qwen3QKNormAttention)
    for cls in loose:
        m = cls(18, 4)  # head_dim 4, inner width 16 (the oracle test runs width 24 with 5 heads)
        assert m.self_attn.o_proj.weight.shape == (18, 16)
        m(torch.randn(2, 3, 18))
        with pytest.raises(ZeroDivisionError):
            cls(4, 8)


def test_whisper_encoder_itself_ignores_its_attention_mask():
    """What the encoder wrapper's docstring says of the library: WhisperEncoder passes no mask to its
    layers."""
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(d_model=8, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=8,
                           num_mel_bins=4, max_source_positions=4)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    encoder = WhisperEncoder(config).eval()
    features = torch.randn(2, 4, 8)
    with torch.no_grad():
        plain = encoder(features).last_hidden_state
        masked = encoder(features, attention_mask=torch.tensor([[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0]]))
    torch.testing.assert_close(masked.last_hidden_state, plain, rtol=0, atol=0)
