"""Proof that every wrapper in tests/fixtures/library_others.py is correct attention, and that its
docstring tells the truth.

Each wrapper (module `.double()`, eval mode) is compared with a float64 oracle written here from scratch:
the layer's own weights are read by their library names and split per head, and softmax(q k^T / sqrt(d)
+ bias) v is computed with einsum and an explicit max-subtracted softmax, with this file's own rotary
embedding (pairing, rotary fraction and theta from the module's configuration), its own ALiBi slopes
(asserted equal to the library's), its own key/value head grouping (interleaved h // G or tiled
h % Hkv), causal triangle and window. With a padding mask only the rows of kept query positions are
compared (what a layer outputs at a padded query is unspecified). Wrappers whose library computes a part
in float32 inside a float64 run are compared at a float32 tolerance, and a separate test shows that
exactly those parts are float32: patched back to float64, each such layer agrees with the oracle at
1e-10. Float32 runs agree at 1e-4. Then one test per documented quirk: the grouping conventions, how the
window counts, what a mask does to causality, the RoPE constraints, the unused parameters of the
encoder layer, the positions each wrapper passes through, and the libraries' surprises.

Nothing here uses the project's conformance package.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tests.fixtures import library_others as L

E = 24  # model width of the self-attention wrappers
SHAPES = [(1, 9), (2, 5), (3, 7)]  # (B, L), B != L; longest first, so x-transformers' ALiBi cache is sliced
CROSS_SHAPES = [(2, 5, 3), (3, 7, 9), (1, 9, 4)]  # (B, Lq, Lk)
F64 = {"rtol": 1e-10, "atol": 1e-12}
# A float32 part inside a float64 run (each spec's comment says which; the *_float32_part* tests prove it):
# float32-rounded attention probabilities or q/k give output errors up to about 1.2e-7 (measured) on
# outputs of order 1, against about 3e-16 for the float64 wrappers.
F32_PARTS = {"rtol": 1e-5, "atol": 1e-6}
F32_RUN = {"rtol": 1e-4, "atol": 2e-5}
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


def rope(x, pos, freqs):
    """Interleaved rotary embedding of x (B, H, L, D) at positions pos, (L) or (B, L): dimensions 2i and
    2i+1 rotate by pos * freqs[i]; the first 2 * len(freqs) dimensions rotate, the rest pass."""
    n = freqs.numel()
    angle = pos.double()[..., None] * freqs  # (L, n) or (B, L, n)
    if angle.dim() == 3:
        angle = angle[:, None]
    cos, sin = angle.cos(), angle.sin()
    rot, rest = x[..., : 2 * n], x[..., 2 * n:]
    a, b = rot[..., 0::2], rot[..., 1::2]
    rot = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([rot, rest], dim=-1)


def rope_freqs(r, base):
    """theta_i = base ** (-2i / r), i < ceil(r / 2), float64."""
    return float(base) ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)


def alibi_slopes(n):
    """The ALiBi paper's slopes from the formula: 2 ** (-8k / n), k = 1..n, for a power of two n; else the
    slopes of m = 2 ** floor(log2 n), then the odd-k slopes of 2m, as many as are missing."""
    m = 2 ** math.floor(math.log2(n))
    own = [2.0 ** (-8.0 * k / m) for k in range(1, m + 1)]
    extra = [2.0 ** (-8.0 * k / (2 * m)) for k in range(1, 2 * m + 1, 2)]
    return torch.tensor(own + extra[: n - m], dtype=torch.float64)


def attention(q, k, v, group, allowed=None, bias=None):
    """q (B, H, Lq, d), k and v (B, Hkv, Lk, d) -> (B, Lq, H * d). group: "interleaved" (query head h
    reads key/value head h // (H / Hkv)) or "tiled" (h % Hkv). allowed: bool, True = may attend; bias:
    additive; both broadcast to (B, H, Lq, Lk)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    h = torch.arange(heads)
    reads = h // (heads // kv_heads) if group == "interleaved" else h % kv_heads
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


def output(out, o):
    if o is None:
        return out
    w, b = o
    out = out @ w.detach().double().T
    return out if b is None else out + b.detach().double()


def oracle(P, xq, xk, xv, heads, kv_heads, group, allowed=None, bias=None, rotary=None):
    """P: {"q"|"k"|"v": (weight, bias or None), "o": (weight, bias or None) or None (no projection)}."""
    q, k, v = project(xq, *P["q"], heads), project(xk, *P["k"], kv_heads), project(xv, *P["v"], kv_heads)
    if rotary is not None:
        q, k = rotary(q), rotary(k)
    return output(attention(q, k, v, group, allowed=allowed, bias=bias), P["o"])


def lin(layer):
    return layer.weight, layer.bias


def tril(n):
    return torch.ones(n, n, dtype=torch.bool).tril()


def window(n, past):
    """Key j visible from query i iff 0 <= i - j <= past."""
    d = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    return (d >= 0) & (d <= past)


def visible(keep, n, causal=False, past=None):
    """(B or 1, 1, n, n) visibility from kept keys (B, n) or None, causality and a window."""
    a = torch.ones(1, 1, n, n, dtype=torch.bool)
    if keep is not None:
        a = a & keep[:, None, None, :]
    if causal:
        a = a & tril(n)
    if past is not None:
        a = a & window(n, past)
    return a


def padding(b, n, gen):
    """Kept keys (B, n): key 0 kept, key 1 masked before the kept key 2, the rest scattered."""
    keep = torch.rand(b, n, generator=gen) < 0.6
    keep[:, 0] = True
    if n >= 3:
        keep[:, 1], keep[:, 2] = False, True
    return keep


# ---------------------------------------------------------------------------------------------
# Per wrapper: configs, build(cfg), call(m, x, keep) with keep (B, L) bool (True = token) or None turned
# into the library's own mask, oracle(m, cfg, x, keep, group=..., pos=...), tolerance, causal(cfg).
# ---------------------------------------------------------------------------------------------
def xt_params(attn):
    to_out = attn.to_out
    return {"q": lin(attn.to_q), "k": lin(attn.to_k), "v": lin(attn.to_v),
            "o": None if isinstance(to_out, torch.nn.Identity) else lin(to_out)}


def xt_oracle(m, cfg, x, keep, group="tiled", pos=None, causal=False, past=None, alibi=False, rotary=False):
    heads, kv_heads = cfg[0], cfg[1] or cfg[0]
    n = x.shape[1]
    bias = rot = None
    if alibi:  # x-transformers' ALiBi: -slope * |i - j|, symmetric
        dist = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
        bias = -alibi_slopes(heads)[:, None, None] * dist
    if rotary:  # AttentionLayers' default rotary_emb_dim = dim_head // 2, base 10000
        freqs = rope_freqs((E // heads) // 2, 10000)
        p = torch.arange(n) if pos is None else pos
        rot = functools.partial(rope, pos=p, freqs=freqs)
    return oracle(xt_params(m.attn), x, x, x, heads, kv_heads, group,
                  allowed=visible(keep, n, causal=causal, past=past), bias=bias, rotary=rot)


def with_mask(m, x, keep):  # x-transformers: bool `mask`, True = keep
    return m(x) if keep is None else m(x, mask=keep)


def tt_call(m, x, keep):
    if keep is None:
        return m(x)
    n = x.shape[1]
    return m(x, mask=tril(n)[None] & keep[:, None, :])  # torchtune: a given mask replaces causality


def tt_oracle(m, cfg, x, keep, group="interleaved", pos=None, causal=True):
    attn = m.attn
    n = x.shape[1]
    freqs = rope_freqs(attn.head_dim, attn.pos_embeddings.base)  # full head, torchtune's base
    p = torch.arange(n) if pos is None else pos
    P = {"q": lin(attn.q_proj), "k": lin(attn.k_proj), "v": lin(attn.v_proj), "o": lin(attn.output_proj)}
    return oracle(P, x, x, x, attn.num_heads, attn.num_kv_heads, group,
                  allowed=visible(keep, n, causal=causal), rotary=functools.partial(rope, pos=p, freqs=freqs))


def mha_params(mha):
    if mha.in_proj_weight is not None:
        ws = mha.in_proj_weight.chunk(3)
    else:
        ws = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
    bs = (None, None, None) if mha.in_proj_bias is None else mha.in_proj_bias.chunk(3)
    return {"q": (ws[0], bs[0]), "k": (ws[1], bs[1]), "v": (ws[2], bs[2]), "o": lin(mha.out_proj)}


def mha_oracle(get):
    def run(m, cfg, x, keep, group="interleaved"):
        mha = get(m)
        return oracle(mha_params(mha), x, x, x, mha.num_heads, mha.num_heads, group,
                      allowed=visible(keep, x.shape[1]))
    return run


def sdpa_call(m, x, keep):
    if keep is None:
        return m(x)
    attn_mask = keep[:, None, None, :]
    if m.causal:
        attn_mask = attn_mask & tril(x.shape[1])  # a given mask replaces causality
    return m(x, attn_mask=attn_mask)


def sdpa_oracle(m, cfg, x, keep, group="interleaved", causal=None):
    P = {"q": lin(m.q_proj), "k": lin(m.k_proj), "v": lin(m.v_proj), "o": lin(m.o_proj)}
    causal = m.causal if causal is None else causal
    return oracle(P, x, x, x, m.heads, m.kv_heads, group, allowed=visible(keep, x.shape[1], causal=causal))


def diffusers_call(m, x, keep):
    if keep is None:
        return m(x)
    # diffusers' UNet convention: (1 - keep) * -10000.0, as (B, 1, Lk)
    return m(x, attention_mask=((1.0 - keep.to(x.dtype)) * -10000.0)[:, None, :])


def diffusers_oracle(m, cfg, x, keep, group="interleaved"):
    a = m.attn
    P = {"q": lin(a.to_q), "k": lin(a.to_k), "v": lin(a.to_v), "o": lin(a.to_out[0])}
    return oracle(P, x, x, x, a.heads, a.heads, group, allowed=visible(keep, x.shape[1]))


SPECS = {}
LIB = {}  # class -> the optional library it needs

if L.HAS_X_TRANSFORMERS:
    SPECS.update({
        # float32 part: x-transformers' softmax (F.softmax(..., dtype=torch.float32)).
        # heads 1: no output projection (to_out is nn.Identity).
        L.XTransformersGroupedQueryAttention: dict(
            configs=[(1, None, False), (4, 2, False), (6, 3, True), (4, 1, True), (3, 3, False)],
            build=lambda c: L.XTransformersGroupedQueryAttention(E, c[0], kv_heads=c[1], causal=c[2]),
            call=with_mask, oracle=lambda m, c, x, keep, **kw: xt_oracle(m, c, x, keep, causal=c[2], **kw),
            tol=F32_PARTS, causal=lambda c: c[2],
        ),
        # float32 parts: the softmax, and RotaryEmbedding's inv_freq computed in float32.
        # dim_head 24, 12, 8, 6, 3 -> rotary_emb_dim 12, 6, 4, 3 (odd: 4 dims rotate), 1 (2 of 3 rotate).
        L.XTransformersRotaryAttention: dict(
            configs=[(1, None), (2, None), (3, 1), (4, 2), (8, 4)],
            build=lambda c: L.XTransformersRotaryAttention(E, c[0], kv_heads=c[1]),
            call=with_mask,
            oracle=lambda m, c, x, keep, **kw: xt_oracle(m, c, x, keep, causal=True, rotary=True, **kw),
            tol=F32_PARTS, causal=lambda c: True,
        ),
        # float32 parts: the softmax, and AlibiPositionalBias' slopes stored in a float32 tensor.
        L.XTransformersAlibiAttention: dict(
            configs=[(1, None, True), (3, None, True), (4, 2, True), (6, 2, True), (8, 4, False),
                     (6, None, False)],
            build=lambda c: L.XTransformersAlibiAttention(E, c[0], kv_heads=c[1], causal=c[2]),
            call=with_mask,
            oracle=lambda m, c, x, keep, **kw: xt_oracle(m, c, x, keep, causal=c[2], alibi=True, **kw),
            tol=F32_PARTS, causal=lambda c: c[2],
        ),
        # float32 part: the softmax.
        L.XTransformersWindowAttention: dict(
            configs=[(2, None, 0), (4, 2, 1), (3, None, 3), (6, 3, 2)],
            build=lambda c: L.XTransformersWindowAttention(E, c[0], kv_heads=c[1], max_attend_past=c[2]),
            call=with_mask,
            oracle=lambda m, c, x, keep, **kw: xt_oracle(m, c, x, keep, causal=True, past=c[2], **kw),
            tol=F32_PARTS, causal=lambda c: True,
        ),
    })
    LIB.update(dict.fromkeys(SPECS, "x_transformers"))

if L.HAS_TORCHTUNE:
    # float32 part: torchtune's RoPE (x.float(), a float32 cos/sin table): q and k are float32-rounded.
    SPECS[L.TorchtuneGroupedQueryAttention] = dict(
        configs=[(1, 1), (2, 2), (4, 2), (6, 3), (3, 1)],
        build=lambda c: L.TorchtuneGroupedQueryAttention(E, c[0], num_kv_heads=c[1]),
        call=tt_call, oracle=tt_oracle, tol=F32_PARTS, causal=lambda c: True,
    )
    LIB[L.TorchtuneGroupedQueryAttention] = "torchtune"

SPECS.update({
    # even heads with bias: torch's fast path (eval, no grad); odd heads or no bias: the Python path.
    L.TorchMultiheadSelfAttention: dict(
        configs=[(1, True), (2, True), (3, True), (4, False), (6, True)],
        build=lambda c: L.TorchMultiheadSelfAttention(E, c[0], bias=c[1]),
        call=lambda m, x, keep: m(x) if keep is None else m(x, key_padding_mask=~keep),
        oracle=mha_oracle(lambda m: m.attn), tol=F64,
    ),
    L.TorchEncoderLayerSelfAttention: dict(
        configs=[2, 3, 4],
        build=lambda c: L.TorchEncoderLayerSelfAttention(E, c),
        call=lambda m, x, keep: m(x) if keep is None else m(x, src_key_padding_mask=~keep),
        oracle=mha_oracle(lambda m: m.layer.self_attn), tol=F64,
    ),
    L.SDPAGroupedQueryAttention: dict(
        configs=[(2, 2, False, False), (4, 2, True, False), (6, 3, False, True), (3, 1, True, True),
                 (8, 2, True, False)],
        build=lambda c: L.SDPAGroupedQueryAttention(E, c[0], kv_heads=c[1], causal=c[2], bias=c[3]),
        call=sdpa_call, oracle=sdpa_oracle, tol=F64, causal=lambda c: c[2],
    ),
})

if L.HAS_DIFFUSERS:
    SPECS[L.DiffusersSelfAttention] = dict(
        configs=[(1, False), (2, True), (3, False), (4, True)],
        build=lambda c: L.DiffusersSelfAttention(E, c[0], bias=c[1]),
        call=diffusers_call, oracle=diffusers_oracle, tol=F64,
    )
    LIB[L.DiffusersSelfAttention] = "diffusers"

SELF = list(SPECS)
IDS = [c.__name__ for c in SELF]
CAUSAL = [c for c in SELF if any(SPECS[c].get("causal", lambda g: False)(g) for g in SPECS[c]["configs"])]


def needs(cls):
    if cls in LIB:
        pytest.importorskip(LIB[cls])


def build(spec, cfg, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return spec["build"](cfg).to(dtype).eval()


def randn(*shape, gen, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def exact(spec):
    return {"rtol": 0.0, "atol": 1e-12 if spec["tol"] is F64 else 1e-6}


# ---------------------------------------------------------------------------------------------
# Agreement with the oracle
# ---------------------------------------------------------------------------------------------
def test_registry_covers_the_collection():
    assert set(SELF) | {L.TorchMultiheadCrossAttention} == set(L.LAYERS)
    assert len(L.LAYERS) == 4 + 4 * L.HAS_X_TRANSFORMERS + L.HAS_TORCHTUNE + L.HAS_DIFFUSERS
    for cls in L.LAYERS:
        assert issubclass(cls, torch.nn.Module)
        assert cls.__doc__ and len(cls.__doc__) > 400, cls.__name__


@pytest.mark.parametrize("cls", SELF, ids=IDS)
def test_matches_oracle_without_and_with_padding(cls):
    needs(cls)
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for cfg in spec["configs"]:
            m = build(spec, cfg)
            for b, n in SHAPES:
                x = randn(b, n, E, gen=gen)
                got = spec["call"](m, x, None)
                assert got.shape == (b, n, E) and got.dtype == torch.float64
                torch.testing.assert_close(got, spec["oracle"](m, cfg, x, None), **spec["tol"])
                keep = padding(b, n, gen)
                got = spec["call"](m, x, keep)[keep]  # rows of kept queries only
                torch.testing.assert_close(got, spec["oracle"](m, cfg, x, keep)[keep], **spec["tol"])


@pytest.mark.parametrize("cls", SELF, ids=IDS)
def test_padded_keys_are_invisible(cls):
    """Noise at padded positions leaves the kept rows as they were; without the mask it does not."""
    needs(cls)
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for cfg in spec["configs"][1:3]:
            m = build(spec, cfg)
            b, n = 3, 7
            x = randn(b, n, E, gen=gen)
            keep = padding(b, n, gen)
            x2 = torch.where(keep[..., None], x, 40.0 * randn(*x.shape, gen=gen) + 10.0)
            torch.testing.assert_close(spec["call"](m, x2, keep)[keep], spec["call"](m, x, keep)[keep],
                                       **exact(spec))
            assert not torch.allclose(spec["call"](m, x2, None)[keep], spec["call"](m, x, None)[keep])


@pytest.mark.parametrize("cls", CAUSAL, ids=[c.__name__ for c in CAUSAL])
def test_causal_wrappers_ignore_the_future(cls):
    needs(cls)
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for cfg in spec["configs"]:
            if not spec["causal"](cfg):
                continue
            m = build(spec, cfg)
            b, n = 2, 6
            x = randn(b, n, E, gen=gen)
            before = spec["call"](m, x, None)
            for t in range(n - 1):
                x2 = x.clone()
                x2[:, t + 1:] = 30.0 * randn(b, n - t - 1, E, gen=gen)
                torch.testing.assert_close(spec["call"](m, x2, None)[:, : t + 1], before[:, : t + 1],
                                           **exact(spec))


@pytest.mark.parametrize("cls", SELF, ids=IDS)
def test_float32_agrees_with_the_float64_oracle(cls):
    needs(cls)
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for cfg in spec["configs"][1:3]:
            m = build(spec, cfg, dtype=torch.float32)
            b, n = 3, 5
            x = randn(b, n, E, gen=gen, dtype=torch.float32)
            got = spec["call"](m, x, None)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), spec["oracle"](m, cfg, x, None), **F32_RUN)
            keep = padding(b, n, gen)
            got = spec["call"](m, x, keep)[keep].double()
            torch.testing.assert_close(got, spec["oracle"](m, cfg, x, keep)[keep], **F32_RUN)


def test_torch_cross_attention_matches_oracle():
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for e, heads, kdim, vdim in [(12, 3, None, None), (12, 2, 10, 7), (12, 4, 5, None), (12, 1, None, 9)]:
            torch.manual_seed(0)
            m = L.TorchMultiheadCrossAttention(e, heads, kdim=kdim, vdim=vdim).double().eval()
            # separate q/k/v weights exactly when kdim or vdim differs from embed_dim
            assert (m.attn.in_proj_weight is None) == (kdim is not None or vdim is not None)
            P = mha_params(m.attn)
            for b, lq, lk in CROSS_SHAPES:
                q = randn(b, lq, e, gen=gen)
                k, v = randn(b, lk, kdim or e, gen=gen), randn(b, lk, vdim or e, gen=gen)
                torch.testing.assert_close(m(q, k, v), oracle(P, q, k, v, heads, heads, "interleaved"), **F64)
                keep = padding(b, lk, gen)
                want = oracle(P, q, k, v, heads, heads, "interleaved", allowed=keep[:, None, None, :])
                torch.testing.assert_close(m(q, k, v, key_padding_mask=~keep), want, **F64)  # every query row
            m32 = m.float()
            f32 = functools.partial(randn, gen=gen, dtype=torch.float32)
            q, k, v = f32(2, 5, e), f32(2, 3, kdim or e), f32(2, 3, vdim or e)
            want = oracle(mha_params(m32.attn), q, k, v, heads, heads, "interleaved")
            torch.testing.assert_close(m32(q, k, v).double(), want, **F32_RUN)


# ---------------------------------------------------------------------------------------------
# The documented quirks
# ---------------------------------------------------------------------------------------------
GROUPING = [("XTransformersGroupedQueryAttention", (4, 2, False), "tiled", "x_transformers"),
            ("XTransformersRotaryAttention", (4, 2), "tiled", "x_transformers"),
            ("TorchtuneGroupedQueryAttention", (4, 2), "interleaved", "torchtune"),
            ("SDPAGroupedQueryAttention", (4, 2, False, False), "interleaved", None)]


@pytest.mark.parametrize(("name", "cfg", "group", "lib"), GROUPING, ids=[g[0] for g in GROUPING])
def test_grouping_convention_is_as_documented(name, cfg, group, lib):
    if lib:
        pytest.importorskip(lib)
    spec = SPECS[getattr(L, name)]
    other = {"tiled": "interleaved", "interleaved": "tiled"}[group]
    x = randn(2, 6, E, gen=torch.Generator().manual_seed(6))
    with torch.no_grad():
        m = build(spec, cfg)
        got = spec["call"](m, x, None)
        torch.testing.assert_close(got, spec["oracle"](m, cfg, x, None, group=group), **spec["tol"])
        assert (got - spec["oracle"](m, cfg, x, None, group=other)).abs().max() > 1e-2


def test_x_transformers_window_counts_the_keys_before_the_row():
    """max_attend_past=w: query i sees key j iff 0 <= i - j <= w (itself and w keys before, w + 1 keys)."""
    pytest.importorskip("x_transformers")
    gen = torch.Generator().manual_seed(7)
    n = 8
    with torch.no_grad():
        for past in (1, 2, 3):
            torch.manual_seed(0)
            m = L.XTransformersWindowAttention(E, 2, max_attend_past=past).double().eval()
            x = randn(1, n, E, gen=gen)
            before = m(x)
            for j in range(n):
                x2 = x.clone()
                x2[:, j] = 20.0 * randn(E, gen=gen)
                changed = ((m(x2) - before).abs().amax(dim=-1) > 1e-9)[0]
                assert changed.tolist() == [0 <= i - j <= past for i in range(n)], (past, j)


def test_x_transformers_mask_is_combined_with_causality():
    """An all-True mask changes nothing: the causal triangle (and window) stays."""
    pytest.importorskip("x_transformers")
    x = randn(2, 6, E, gen=torch.Generator().manual_seed(8))
    everything = torch.ones(2, 6, dtype=torch.bool)
    with torch.no_grad():
        for cls, cfg in [(L.XTransformersGroupedQueryAttention, (4, 2, True)),
                         (L.XTransformersRotaryAttention, (4, 2)),
                         (L.XTransformersAlibiAttention, (4, 2, True)),
                         (L.XTransformersWindowAttention, (4, 2, 2))]:
            m = build(SPECS[cls], cfg)
            torch.testing.assert_close(m(x, mask=everything), m(x), rtol=0, atol=0)


def test_torchtune_mask_replaces_causality():
    """An all-True (B, L, L) mask makes torchtune's causal layer bidirectional."""
    pytest.importorskip("torchtune")
    b, n = 2, 6
    x = randn(b, n, E, gen=torch.Generator().manual_seed(8))
    with torch.no_grad():
        m = build(SPECS[L.TorchtuneGroupedQueryAttention], (4, 2))
        full = m(x, mask=torch.ones(b, n, n, dtype=torch.bool))
        torch.testing.assert_close(full, tt_oracle(m, None, x, None, causal=False), **F32_PARTS)
        assert not torch.allclose(full[:, 0], m(x)[:, 0])


def test_sdpa_module_mask_replaces_causality():
    """An all-True attn_mask makes the causal SDPA module bidirectional; and why the module drops
    is_causal when given a mask: torch documents an error, its math backend raises it, the default CPU
    kernel instead ANDs the mask with the causal triangle."""
    gen = torch.Generator().manual_seed(8)
    b, n = 2, 6
    x = randn(b, n, E, gen=gen)
    with torch.no_grad():
        m = build(SPECS[L.SDPAGroupedQueryAttention], (4, 2, True, False))
        torch.testing.assert_close(m(x), sdpa_oracle(m, None, x, None, causal=True), **F64)
        full = m(x, attn_mask=torch.ones(b, 1, 1, n, dtype=torch.bool))
        torch.testing.assert_close(full, sdpa_oracle(m, None, x, None, causal=False), **F64)
        assert not torch.allclose(full[:, 0], m(x)[:, 0])
        q = randn(1, 2, 5, 4, gen=gen)
        pad = torch.tensor([True, False, True, True, False]).expand(5, 5)
        with pytest.raises(RuntimeError, match="is_causal"), sdpa_kernel([SDPBackend.MATH]):
            F.scaled_dot_product_attention(q, q, q, attn_mask=pad, is_causal=True)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, q, q, attn_mask=pad, is_causal=True),
                                   F.scaled_dot_product_attention(q, q, q, attn_mask=pad & tril(5)), **F64)


def test_x_transformers_quirks():
    pytest.importorskip("x_transformers")
    from x_transformers.x_transformers import AlibiPositionalBias

    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        # heads=1: no output projection
        assert isinstance(L.XTransformersGroupedQueryAttention(E, 1).attn.to_out, torch.nn.Identity)
        assert isinstance(L.XTransformersGroupedQueryAttention(E, 2).attn.to_out, torch.nn.Linear)
        # no biases anywhere
        for cls in (L.XTransformersGroupedQueryAttention, L.XTransformersRotaryAttention,
                    L.XTransformersAlibiAttention, L.XTransformersWindowAttention):
            assert all(not n.endswith("bias") for n, _ in cls(E, 4).named_parameters())
        # the output rows of padded queries are exactly 0
        m = L.XTransformersRotaryAttention(E, 4, kv_heads=2).double().eval()
        x, keep = randn(3, 7, E, gen=gen), padding(3, 7, gen)
        assert (m(x, mask=keep)[~keep] == 0).all()
        # ALiBi slopes: the paper's formula, stored in float32; heads beyond alibi_num_heads get none
        for n in range(1, 17):
            lib = AlibiPositionalBias(n).slopes.flatten()
            assert lib.dtype == torch.float32
            torch.testing.assert_close(lib.double(), alibi_slopes(n), rtol=1e-7, atol=0)
        m = L.XTransformersAlibiAttention(E, 4, alibi_num_heads=2).double()
        bias = m.rel_pos(5, 5)
        assert bias.shape == (4, 5, 5) and (bias[2:] == 0).all() and (bias[:2] != 0).any()
        # the ALiBi bias is cached at the longest length seen and sliced for shorter sequences
        spec, cfg = SPECS[L.XTransformersAlibiAttention], (4, 2, True)
        m = build(spec, cfg)
        m(randn(1, 9, E, gen=gen))
        x = randn(2, 5, E, gen=gen)
        torch.testing.assert_close(m(x), spec["oracle"](m, cfg, x, None), **F32_PARTS)
        assert m.rel_pos.bias.shape[-2:] == (9, 9)
        # rotary: rotary_emb_dim = dim_head // 2; an odd one rotates one dimension more
        assert L.XTransformersRotaryAttention(E, 4).rotary_pos_emb.inv_freq.numel() == 2  # dim_head 6, r 3
        # kv_heads must divide heads (x-transformers asserts)
        with pytest.raises(AssertionError):
            L.XTransformersGroupedQueryAttention(E, 4, kv_heads=3)


def test_x_transformers_rotary_dim_constraints():
    """rotary_emb_dim 2 (dim_head 4 or 5) fails in RotaryEmbedding's constructor; dim_head 1 gives
    rotary_emb_dim 0 and rotates nothing."""
    pytest.importorskip("x_transformers")
    for dim, heads in [(16, 4), (20, 4)]:
        with pytest.raises(ZeroDivisionError):
            L.XTransformersRotaryAttention(dim, heads)
    torch.manual_seed(0)
    m = L.XTransformersRotaryAttention(8, 8).double().eval()  # dim_head 1
    assert m.rotary_pos_emb.inv_freq.numel() == 0
    x = randn(2, 5, 8, gen=torch.Generator().manual_seed(10))
    want = oracle(xt_params(m.attn), x, x, x, 8, 8, "tiled", allowed=visible(None, 5, causal=True))
    with torch.no_grad():
        torch.testing.assert_close(m(x), want, **F32_PARTS)


def test_torchtune_constraints():
    """An odd head_dim builds, then fails in forward (RoPE pairs); the divisibility checks are torchtune's
    ValueErrors; the rotary table is cached for max_seq_len positions."""
    pytest.importorskip("torchtune")
    m = L.TorchtuneGroupedQueryAttention(18, 2)  # head_dim 9
    with pytest.raises(RuntimeError):
        m(torch.randn(2, 5, 18))
    with pytest.raises(ValueError):
        L.TorchtuneGroupedQueryAttention(18, 4)  # 18 % 4
    with pytest.raises(ValueError):
        L.TorchtuneGroupedQueryAttention(24, 4, num_kv_heads=3)
    rope_table = L.TorchtuneGroupedQueryAttention(24, 4, max_seq_len=32).attn.pos_embeddings.cache
    assert rope_table.shape == (32, 3, 2)  # (max_seq_len, head_dim / 2, cos and sin)


def test_torchtune_input_pos_is_passed_through():
    pytest.importorskip("torchtune")
    gen = torch.Generator().manual_seed(11)
    b, n, cfg = 3, 6, (4, 2)
    x = randn(b, n, E, gen=gen)
    pos = torch.randint(0, 40, (b, n), generator=gen)
    with torch.no_grad():
        m = build(SPECS[L.TorchtuneGroupedQueryAttention], cfg)
        got = m(x, input_pos=pos)
        torch.testing.assert_close(got, tt_oracle(m, cfg, x, None, pos=pos), **F32_PARTS)
        assert not torch.allclose(got, m(x))
        keep = padding(b, n, gen)
        got = m(x, mask=tril(n)[None] & keep[:, None, :], input_pos=pos)[keep]
        torch.testing.assert_close(got, tt_oracle(m, cfg, x, keep, pos=pos)[keep], **F32_PARTS)


def test_x_transformers_pos_is_passed_through():
    pytest.importorskip("x_transformers")
    gen = torch.Generator().manual_seed(11)
    b, n, cfg = 3, 6, (4, 2)
    x = randn(b, n, E, gen=gen)
    spec = SPECS[L.XTransformersRotaryAttention]
    with torch.no_grad():
        m = build(spec, cfg)
        for pos in (torch.randint(0, 40, (b, n), generator=gen), torch.randint(0, 40, (n,), generator=gen)):
            got = m(x, pos=pos)
            torch.testing.assert_close(got, spec["oracle"](m, cfg, x, None, pos=pos), **F32_PARTS)
            assert not torch.allclose(got, m(x))


def test_x_transformers_float32_parts_are_exactly_the_documented_ones():
    """float32-inexact in float64; agrees with the oracle at 1e-10 once the softmax runs in float64 and the
    rotary frequencies / ALiBi slopes hold float64 values: nothing else is float32."""
    pytest.importorskip("x_transformers")
    gen = torch.Generator().manual_seed(12)
    b, n = 3, 7
    x, keep = randn(b, n, E, gen=gen), padding(b, n, gen)
    with torch.no_grad():
        for cls, cfg in [(L.XTransformersGroupedQueryAttention, (4, 2, True)),
                         (L.XTransformersRotaryAttention, (4, 2)),
                         (L.XTransformersAlibiAttention, (6, 2, True)),
                         (L.XTransformersWindowAttention, (4, 2, 2))]:
            spec = SPECS[cls]
            m = build(spec, cfg)
            want = spec["oracle"](m, cfg, x, keep)[keep]
            assert m.attn.attend.attn_fn.keywords["dtype"] is torch.float32
            assert (m(x, mask=keep)[keep] - want).abs().max() > 1e-12
            m.attn.attend.attn_fn = functools.partial(F.softmax, dim=-1)  # the softmax in float64
            if cls is L.XTransformersRotaryAttention:
                m.rotary_pos_emb.inv_freq.copy_(rope_freqs((E // cfg[0]) // 2, 10000))
            if cls is L.XTransformersAlibiAttention:
                m.rel_pos.slopes.copy_(alibi_slopes(cfg[0])[:, None, None])
                m.rel_pos.bias = None  # drop the bias cached from the float32 slopes
            torch.testing.assert_close(m(x, mask=keep)[keep], want, **F64)


class Float64Rope(torch.nn.Module):
    """torchtune's RoPE contract (x (B, L, H, D), input_pos) computed in float64, to swap in."""

    def __init__(self, dim, base):
        super().__init__()
        self.freqs = rope_freqs(dim, base)

    def forward(self, x, *, input_pos=None):
        pos = torch.arange(x.shape[1]) if input_pos is None else input_pos
        return rope(x.transpose(1, 2), pos, self.freqs).transpose(1, 2)


def test_torchtune_float32_part_is_exactly_the_rope():
    """torchtune's RoPE rounds q and k to float32; with a float64 RoPE swapped in, the layer agrees with the
    oracle at 1e-10."""
    pytest.importorskip("torchtune")
    gen = torch.Generator().manual_seed(12)
    cfg = (4, 2)
    x = randn(3, 7, E, gen=gen)
    with torch.no_grad():
        m = build(SPECS[L.TorchtuneGroupedQueryAttention], cfg)
        want = tt_oracle(m, cfg, x, None)
        q = randn(3, 7, 4, 6, gen=gen)
        rope32 = m.attn.pos_embeddings
        assert torch.equal(rope32(q), rope32(q.float().double()))  # q is rounded to float32 first
        assert (m(x) - want).abs().max() > 1e-12
        m.attn.pos_embeddings = Float64Rope(6, rope32.base)
        torch.testing.assert_close(m(x), want, **F64)


def test_encoder_layer_unused_parameters_get_no_gradient():
    torch.manual_seed(0)
    m = L.TorchEncoderLayerSelfAttention(E, 4).double().train()
    assert m.layer.self_attn.dropout == 0.1  # torch's default, attention-weight dropout in training
    x = randn(2, 5, E, gen=torch.Generator().manual_seed(13))
    m(x, src_key_padding_mask=torch.tensor([[False] * 5, [False] * 3 + [True] * 2])).square().sum().backward()
    for name, p in m.named_parameters():
        used = name.startswith("layer.self_attn.")
        assert (p.grad is not None) == used, name
        if used:
            assert p.grad.abs().sum() > 0, name
    assert {n.split(".")[1] for n, p in m.named_parameters() if p.grad is None} == {
        "linear1", "linear2", "norm1", "norm2"}


def test_torch_multihead_attention_paths_and_masks():
    """Even heads with bias take torch's fast path in eval without grad, odd heads do not (both match the
    oracle above); a float additive key_padding_mask equals the bool one; embed_dim % num_heads asserts."""
    gen = torch.Generator().manual_seed(14)
    x, keep = randn(2, 5, E, gen=gen), padding(2, 5, gen)
    for heads, fast in [(2, True), (3, False)]:
        torch.manual_seed(0)
        m = L.TorchMultiheadSelfAttention(E, heads).double().eval()
        with torch.no_grad(), torch.profiler.profile() as prof:
            got = m(x, key_padding_mask=~keep)
        names = {e.name for e in prof.events()}
        assert ("aten::_native_multi_head_attention" in names) == fast
        additive = torch.zeros(2, 5, dtype=torch.float64).masked_fill(~keep, NEG)
        with torch.no_grad():
            torch.testing.assert_close(m(x, key_padding_mask=additive)[keep], got[keep], **F64)
    with pytest.raises(AssertionError):
        L.TorchMultiheadSelfAttention(E, 5)


def test_sdpa_module_constraints():
    m = L.SDPAGroupedQueryAttention(E, 4, kv_heads=3)  # builds; SDPA refuses 4 query heads over 3
    with pytest.raises(RuntimeError):
        m(torch.randn(2, 5, E))
    assert all(not n.endswith("bias") for n, _ in L.SDPAGroupedQueryAttention(E, 4).named_parameters())


def test_diffusers_quirks():
    """AttnProcessor2_0 ignores Attention(is_causal=True) and crashes on Attention(kv_heads < heads); a bool
    mask (True = attend) and a (B, L, L) additive mask work like the (B, 1, L) additive one."""
    pytest.importorskip("diffusers")
    from diffusers.models.attention_processor import Attention

    gen = torch.Generator().manual_seed(15)
    b, n = 2, 6
    x, keep = randn(b, n, E, gen=gen), padding(b, n, gen)
    with torch.no_grad():
        m = build(SPECS[L.DiffusersSelfAttention], (3, False))
        want = diffusers_oracle(m, None, x, keep)[keep]
        torch.testing.assert_close(m(x, attention_mask=keep[:, None, :])[keep], want, **F64)
        per_query = ((1.0 - keep.double()) * -10000.0)[:, None, :].expand(b, n, n)
        torch.testing.assert_close(m(x, attention_mask=per_query)[keep], want, **F64)

        torch.manual_seed(0)
        causal = Attention(E, heads=3, dim_head=8, is_causal=True).double().eval()
        assert causal.is_causal and type(causal.processor).__name__ == "AttnProcessor2_0"
        m.attn.load_state_dict(causal.state_dict())
        torch.testing.assert_close(causal(x), m(x), rtol=0, atol=0)  # not causal at all
        x2 = x.clone()
        x2[:, -1] += 5.0
        assert not torch.allclose(causal(x2)[:, 0], causal(x)[:, 0])  # the first row sees the last token

        gqa = Attention(E, heads=4, kv_heads=2, dim_head=6).double()
        with pytest.raises(RuntimeError):
            gqa(x)
