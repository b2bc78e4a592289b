"""Proof that every module in tests/fixtures/wild_styles.py is correct multi-head attention.

Each module is compared, in float64, with a reference written here from scratch: the module's own
projection weights are read out per head, and softmax(q k^T / sqrt(head_dim) + bias) v is computed
with einsum and an explicit softmax, heads concatenated, output projection applied. Rotary embeddings
(half-split or interleaved pairs, positions 0..L-1) and grouped key/value heads are applied by the
reference itself. Modules that run their softmax (or rotation) in float32 are compared at a
float32 tolerance; all others at a float64 one.

Besides agreement with the reference, with and without every mask form a module accepts: masked keys
are invisible (replacing the inputs at masked key positions by large noise leaves the outputs that
cannot see them unchanged), causal modules ignore the future, the constructors that must reject a
configuration do, float32 runs agree too, and dropout acts in training mode only.

Nothing here uses the project's conformance package.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.fixtures import wild_styles as W

E = 24  # model width used throughout
CTX_DIM = 10  # context width for the styles whose cross-attention accepts another width
SELF_SHAPES = [(2, 1), (2, 3), (3, 4), (2, 5), (3, 7), (2, 9)]  # (B, L), L != B
CROSS_SHAPES = [(2, 3, 5), (3, 4, 2), (2, 1, 6), (3, 7, 9)]  # (B, Lq, Lk)
TOL = {"f64": {"rtol": 1e-12, "atol": 1e-12}, "f32": {"rtol": 1e-4, "atol": 2e-5}}
NEG = float("-inf")


# ---------------------------------------------------------------------------------------------
# The reference
# ---------------------------------------------------------------------------------------------
def rotate(x, pairing, theta=10000.0):
    """Rotary embedding of x (B, H, L, Dh) at positions 0..L-1, float64."""
    length, dh = x.shape[-2], x.shape[-1]
    half = dh // 2
    inv_freq = theta ** (-torch.arange(half, dtype=torch.float64) * 2.0 / dh)
    angle = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    if pairing == "half":  # dimension i with i + Dh/2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]  # interleaved: dimensions 2i and 2i+1
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def reference(P, xq, xkv, bias=None, causal=False, rope=None):
    """P: q/k/v = (W (heads, Dh, Din), b (heads, Dh)), o = (W (Dout, H*Dv), b) or None.
    bias: additive, broadcastable to (B, H, Lq, Lk), -inf where masked."""
    (wq, bq), (wk, bk), (wv, bv) = P["q"], P["k"], P["v"]
    q = torch.einsum("bld,hkd->bhlk", xq, wq) + bq[None, :, None, :]
    k = torch.einsum("bld,hkd->bhlk", xkv, wk) + bk[None, :, None, :]
    v = torch.einsum("bld,hkd->bhlk", xkv, wv) + bv[None, :, None, :]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # query head h: kv h // rep
    if rope is not None:
        q, k = rotate(q, rope), rotate(k, rope)
    s = torch.einsum("bhik,bhjk->bhij", q, k) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    if causal:
        lq, lk = s.shape[-2:]
        s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool).triu(1), NEG)
    s = s - s.amax(dim=-1, keepdim=True)
    p = s.exp()
    p = p / p.sum(dim=-1, keepdim=True)
    out = torch.einsum("bhij,bhjv->bihv", p, v).flatten(2)
    if P["o"] is not None:
        wo, bo = P["o"]
        out = out @ wo.T + bo
    return out


def split(weight, bias, heads):
    """An nn.Linear-shaped (heads * d, din) weight and its bias, per head."""
    w = weight.detach().reshape(heads, -1, weight.shape[-1])
    b = torch.zeros(w.shape[:2], dtype=w.dtype) if bias is None else bias.detach().reshape(heads, -1)
    return w, b


def lin(layer, heads):
    return split(layer.weight, layer.bias, heads)


def out(layer):
    b = torch.zeros(layer.out_features, dtype=layer.weight.dtype) if layer.bias is None else layer.bias
    return layer.weight.detach(), b.detach()


def qkvo(q, k, v, o, heads, kv_heads=None):
    kv_heads = heads if kv_heads is None else kv_heads
    return {"q": lin(q, heads), "k": lin(k, kv_heads), "v": lin(v, kv_heads),
            "o": None if o is None else out(o)}


def packed(weight, bias, heads, o):
    """(3E, E) packed [q; k; v] weights (nn.MultiheadAttention, nanoGPT c_attn, the functional port)."""
    ws = weight.chunk(3)
    bs = (None, None, None) if bias is None else bias.chunk(3)
    return {"q": split(ws[0], bs[0], heads), "k": split(ws[1], bs[1], heads),
            "v": split(ws[2], bs[2], heads), "o": out(o)}


# ---------------------------------------------------------------------------------------------
# Masks: a keep pattern in the layout a module's mask has, and the converter to its argument
# ---------------------------------------------------------------------------------------------
class MaskCase:
    """keep: bool, True = attend, in the variant's layout. bias: the additive equivalent (-inf where
    masked; 0, or random finite values for additive masks, where kept)."""

    def __init__(self, keep, bias):
        self.keep, self.bias = keep, bias

    def fill(self, value):
        return self.bias.masked_fill(~self.keep, value)

    def finfo_min(self):
        return self.fill(torch.finfo(self.bias.dtype).min)


LAYOUT_SHAPE = {
    "key": lambda b, h, lq, lk: (b, lk),
    "qk": lambda b, h, lq, lk: (b, lq, lk),
    "shared": lambda b, h, lq, lk: (lq, lk),
    "head": lambda b, h, lq, lk: (b, h, lq, lk),
}


def to_4d(layout, t):
    """The layout's tensor broadcast against (B, H, Lq, Lk)."""
    return {"key": lambda: t[:, None, None, :], "qk": lambda: t[:, None], "shared": lambda: t,
            "head": lambda: t}[layout]()


def make_case(variant, b, h, lq, lk, gen, dtype, keep=None):
    shape = LAYOUT_SHAPE[variant["layout"]](b, h, lq, lk)
    if keep is None:
        keep = torch.rand(shape, generator=gen) < 0.6
        keep[..., 0] = True  # at least one key per row, also under causality
    bias = torch.zeros(shape, dtype=dtype)
    if variant.get("real"):
        bias = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    return MaskCase(keep, bias.masked_fill(~keep, NEG))


def key_padding_case(variant, b, h, lq, lk, gen, dtype):
    """A keep pattern that only depends on the key (and, unless shared, the batch), in any layout.
    Key 0 is kept, at least one other key is masked. Returns (case, per-batch key keep (B, Lk))."""
    if variant["layout"] == "shared":
        k1 = torch.rand(lk, generator=gen) < 0.5
        k1[0], k1[-1] = True, False
        keys = k1.expand(b, lk)
    else:
        keys = torch.rand(b, lk, generator=gen) < 0.5
        keys[:, 0], keys[:, -1] = True, False
    full = {"key": lambda: keys, "qk": lambda: keys[:, None, :].expand(b, lq, lk).clone(),
            "shared": lambda: keys[0][None, :].expand(lq, lk).clone(),
            "head": lambda: keys[:, None, None, :].expand(b, h, lq, lk).clone()}[variant["layout"]]()
    return make_case(variant, b, h, lq, lk, gen, dtype, keep=full), keys


def V(layout, kwargs, real=False, self_only=False):
    """A mask variant: its layout, how it becomes forward kwargs, whether finite additive values are
    allowed, whether it only applies to self-attention."""
    return {"layout": layout, "kwargs": kwargs, "real": real, "self_only": self_only}


# ---------------------------------------------------------------------------------------------
# How each style is built, read and called. build(cfg, ctx_dim) -> module; params(module, cfg) -> P;
# call(module, x, ctx, **mask_kwargs) -> output (B, Lq, Dout), ctx None for self-attention.
# ---------------------------------------------------------------------------------------------
def _self(x, ctx):
    return x if ctx is None else ctx


def _seq_first_call(m, x, ctx, **kw):
    kv = _self(x, ctx).transpose(0, 1)
    if "attn_mask" in kw and kw["attn_mask"].dim() == 4:  # per batch and head -> (B * H, Lq, Lk)
        kw["attn_mask"] = kw["attn_mask"].flatten(0, 1)
    return m(x.transpose(0, 1), kv, kv, **kw)[0].transpose(0, 1)


SPECS = {
    W.Qwen2StyleAttention: dict(
        build=lambda cfg, c: W.Qwen2StyleAttention(hidden_size=E, num_attention_heads=cfg),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: qkvo(m.q_proj, m.k_proj, m.v_proj, m.o_proj, cfg),
        call=lambda m, x, ctx, **kw: m(x, **kw)[0],
        masks=[V("qk", lambda c: {"attention_mask": c.finfo_min()[:, None]}, real=True),
               V("qk", lambda c: {"attention_mask": c.bias[:, None]}, real=True)],
        precision="f32",
    ),
    W.MultiHeadedAttention: dict(
        build=lambda cfg, c: W.MultiHeadedAttention(cfg, E),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: qkvo(m.linear_query, m.linear_keys, m.linear_values, m.final_linear, cfg),
        call=lambda m, x, ctx, **kw: m(_self(x, ctx), _self(x, ctx), x, **kw)[0],
        masks=[V("key", lambda c: {"mask": ~c.keep[:, None, :]}),
               V("qk", lambda c: {"mask": ~c.keep})],
        cross=True,
    ),
    W.PerceiverAttention: dict(
        build=lambda cfg, c: W.PerceiverAttention(E, context_dim=c, heads=cfg[0], dim_head=cfg[1]),
        configs=[(1, 24), (2, 5), (3, 8), (4, 6), (6, 3)],
        params=lambda m, cfg: {"q": lin(m.to_q, cfg[0]),
                               "k": split(m.to_kv.weight.chunk(2)[0], None, cfg[0]),
                               "v": split(m.to_kv.weight.chunk(2)[1], None, cfg[0]), "o": out(m.to_out)},
        call=lambda m, x, ctx, **kw: m(x, context=ctx, **kw),
        masks=[V("qk", lambda c: {"mask": c.keep})],
        cross=True, ctx_dim=CTX_DIM,
    ),
    W.SeqFirstMultiheadAttention: dict(
        build=lambda cfg, c: W.SeqFirstMultiheadAttention(E, cfg),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: packed(m.in_proj_weight, m.in_proj_bias, cfg, m.out_proj),
        call=_seq_first_call,
        masks=[V("shared", lambda c: {"attn_mask": ~c.keep}),
               V("shared", lambda c: {"attn_mask": c.bias}, real=True),
               V("head", lambda c: {"attn_mask": ~c.keep}),
               V("key", lambda c: {"key_padding_mask": ~c.keep})],
        cross=True,
    ),
    W.Head: dict(
        build=lambda cfg, c: W.Head(E, cfg),
        configs=[4, 8, 24, 5],
        params=lambda m, cfg: qkvo(m.query, m.key, m.value, None, 1),
        call=lambda m, x, ctx, **kw: m(x),
        masks=[], causal=True,
    ),
    W.MultiHeadAttention: dict(
        build=lambda cfg, c: W.MultiHeadAttention(cfg[0], cfg[1], E),
        configs=[(1, 24), (2, 12), (3, 8), (4, 6), (6, 4), (3, 5)],
        params=lambda m, cfg: {
            "q": (torch.stack([h.query.weight.detach() for h in m.heads]),
                  torch.zeros(cfg[0], cfg[1], dtype=torch.float64)),
            "k": (torch.stack([h.key.weight.detach() for h in m.heads]),
                  torch.zeros(cfg[0], cfg[1], dtype=torch.float64)),
            "v": (torch.stack([h.value.weight.detach() for h in m.heads]),
                  torch.zeros(cfg[0], cfg[1], dtype=torch.float64)),
            "o": out(m.proj)},
        call=lambda m, x, ctx, **kw: m(x),
        masks=[], causal=True,
    ),
    W.RotarySelfAttention: dict(
        build=lambda cfg, c: W.RotarySelfAttention(E, cfg),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: qkvo(m.q_proj, m.k_proj, m.v_proj, m.o_proj, cfg),
        call=lambda m, x, ctx, **kw: m(x, **kw),
        masks=[V("key", lambda c: {"attention_mask": c.keep.long()})],
        causal=True, rope="half",
    ),
    W.LlamaAttentionMeta: dict(
        build=lambda cfg, c: W.LlamaAttentionMeta(E, cfg, max_seq_len=16),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: qkvo(m.wq, m.wk, m.wv, m.wo, cfg),
        call=lambda m, x, ctx, **kw: m(x, **kw),
        masks=[V("shared", lambda c: {"mask": c.bias}, real=True)],
        rope="interleaved", precision="f32",
    ),
    W.BertExtendedMaskSelfAttention: dict(
        build=lambda cfg, c: W.BertExtendedMaskSelfAttention(hidden_size=E, num_attention_heads=cfg),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: qkvo(m.query, m.key, m.value, m.out_proj, cfg),
        call=lambda m, x, ctx, **kw: m(x, **kw),
        masks=[V("key", lambda c: {"attention_mask": c.keep.to(torch.float64)}),
               V("qk", lambda c: {"attention_mask": c.keep.to(torch.float64)})],
    ),
    W.TorchMHASelfAttention: dict(
        build=lambda cfg, c: W.TorchMHASelfAttention(E, cfg),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: packed(m.attn.in_proj_weight, m.attn.in_proj_bias, cfg, m.attn.out_proj),
        call=lambda m, x, ctx, **kw: m(x, **kw),
        masks=[V("shared", lambda c: {"attn_mask": ~c.keep}),
               V("qk", lambda c: {"attn_mask": ~c.keep}),
               V("shared", lambda c: {"attn_mask": c.bias}, real=True),
               V("qk", lambda c: {"attn_mask": c.bias}, real=True)],
    ),
    W.TorchMHAPaddingAttention: dict(
        build=lambda cfg, c: W.TorchMHAPaddingAttention(E, cfg),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: packed(m.self_attn.in_proj_weight, m.self_attn.in_proj_bias, cfg,
                                     m.self_attn.out_proj),
        call=lambda m, x, ctx, **kw: m(x, **kw),
        masks=[V("key", lambda c: {"key_padding_mask": ~c.keep})],
    ),
    W.GroupedQueryAttention: dict(
        build=lambda cfg, c: W.GroupedQueryAttention(E, cfg[0], n_kv_heads=cfg[1], causal=cfg[2]),
        configs=[(2, 2, False), (4, 2, False), (6, 2, False), (3, 1, False), (6, 3, False), (4, 4, False),
                 (2, 2, True), (6, 2, True), (3, 1, True)],
        params=lambda m, cfg: qkvo(m.wq, m.wk, m.wv, m.wo, cfg[0], cfg[1]),
        call=lambda m, x, ctx, **kw: m(x, **kw),
        masks=[V("key", lambda c: {"attn_mask": c.bias[:, None, None, :]}, real=True),
               V("shared", lambda c: {"attn_mask": c.bias}, real=True)],
        causal=lambda cfg: cfg[2],
    ),
    W.Attention: dict(
        build=lambda cfg, c: W.Attention(E, num_heads=cfg[0], qkv_bias=cfg[1]),
        configs=[(1, False), (2, True), (3, False), (4, True), (6, False)],
        params=lambda m, cfg: packed(m.qkv.weight, m.qkv.bias, cfg[0], m.proj),
        call=lambda m, x, ctx, **kw: m(x, **kw),
        masks=[V("head", lambda c: {"attn_bias": c.bias}, real=True),
               V("qk", lambda c: {"attn_bias": c.bias[:, None]}, real=True),
               V("shared", lambda c: {"attn_bias": c.bias}, real=True)],
    ),
    W.FlashCausalSelfAttention: dict(
        build=lambda cfg, c: W.FlashCausalSelfAttention(E, cfg[0], bias=cfg[1], causal=cfg[2]),
        configs=[(1, True, True), (2, False, True), (3, True, True), (6, True, True), (4, True, False),
                 (2, False, False)],
        params=lambda m, cfg: packed(m.c_attn.weight, m.c_attn.bias, cfg[0], m.c_proj),
        call=lambda m, x, ctx, **kw: m(x),
        masks=[], causal=lambda cfg: cfg[2],
    ),
    W.InterleavedQKVAttention: dict(
        build=lambda cfg, c: W.InterleavedQKVAttention(E, cfg),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: {
            "q": split(m.query_key_value.weight.reshape(cfg, 3, -1, E)[:, 0].flatten(0, 1),
                       m.query_key_value.bias.reshape(cfg, 3, -1)[:, 0].flatten(), cfg),
            "k": split(m.query_key_value.weight.reshape(cfg, 3, -1, E)[:, 1].flatten(0, 1),
                       m.query_key_value.bias.reshape(cfg, 3, -1)[:, 1].flatten(), cfg),
            "v": split(m.query_key_value.weight.reshape(cfg, 3, -1, E)[:, 2].flatten(0, 1),
                       m.query_key_value.bias.reshape(cfg, 3, -1)[:, 2].flatten(), cfg),
            "o": out(m.dense)},
        call=lambda m, x, ctx, **kw: m(x, **kw),
        masks=[V("qk", lambda c: {"attention_mask": c.keep[:, None].long()}),
               V("qk", lambda c: {"attention_mask": c.keep[:, None]})],
    ),
    W.EinsumProjectionAttention: dict(
        build=lambda cfg, c: W.EinsumProjectionAttention(E, heads=cfg[0], dim_head=cfg[1], causal=cfg[2]),
        configs=[(1, 24, False), (2, 7, False), (3, 8, False), (8, 4, False), (2, 12, True), (4, 5, True)],
        params=lambda m, cfg: {
            "q": (m.to_q.detach().permute(1, 2, 0), torch.zeros(cfg[0], cfg[1], dtype=torch.float64)),
            "k": (m.to_k.detach().permute(1, 2, 0), torch.zeros(cfg[0], cfg[1], dtype=torch.float64)),
            "v": (m.to_v.detach().permute(1, 2, 0), torch.zeros(cfg[0], cfg[1], dtype=torch.float64)),
            "o": (m.to_out.detach().reshape(cfg[0] * cfg[1], E).T, torch.zeros(E, dtype=torch.float64))},
        call=lambda m, x, ctx, **kw: m(x, **kw),
        masks=[V("key", lambda c: {"mask": c.keep})],
        causal=lambda cfg: cfg[2],
    ),
    W.WhisperMultiHeadAttention: dict(
        build=lambda cfg, c: W.WhisperMultiHeadAttention(E, cfg),
        configs=[1, 2, 3, 4, 6],
        params=lambda m, cfg: qkvo(m.query, m.key, m.value, m.out, cfg),
        call=lambda m, x, ctx, **kw: m(x, xa=ctx, **kw)[0],
        masks=[V("shared", lambda c: {"mask": c.bias}, real=True, self_only=True)],
        cross=True, precision="f32",
    ),
    W.CrossAttention: dict(
        build=lambda cfg, c: W.CrossAttention(E, context_dim=c, heads=cfg[0], dim_head=cfg[1]),
        configs=[(1, 24), (2, 12), (3, 5), (4, 6), (8, 3)],
        params=lambda m, cfg: qkvo(m.to_q, m.to_k, m.to_v, m.to_out[0], cfg[0]),
        call=lambda m, x, ctx, **kw: m(x, context=ctx, **kw),
        masks=[V("key", lambda c: {"mask": c.keep})],
        cross=True, ctx_dim=CTX_DIM,
    ),
}

if W.HAS_TRANSFORMERS:
    SPECS.update({
        W.HFLlamaSelfAttention: dict(
            build=lambda cfg, c: W.HFLlamaSelfAttention(E, cfg[0], num_key_value_heads=cfg[1]),
            configs=[(1, 1), (2, 2), (3, 3), (4, 2), (6, 2), (6, 1)],
            params=lambda m, cfg: qkvo(m.self_attn.q_proj, m.self_attn.k_proj, m.self_attn.v_proj,
                                       m.self_attn.o_proj, cfg[0], cfg[1]),
            call=lambda m, x, ctx, **kw: m(x, **kw),
            masks=[V("key", lambda c: {"attention_mask": c.keep.long()})],
            causal=True, rope="half", precision="f32",
        ),
        W.HFBartSelfAttention: dict(
            build=lambda cfg, c: W.HFBartSelfAttention(E, cfg),
            configs=[1, 2, 3, 4, 6],
            params=lambda m, cfg: qkvo(m.self_attn.q_proj, m.self_attn.k_proj, m.self_attn.v_proj,
                                       m.self_attn.out_proj, cfg),
            call=lambda m, x, ctx, **kw: m(x, key_value_states=ctx, **kw),
            masks=[V("key", lambda c: {"attention_mask": c.keep.long()})],
            cross=True,
        ),
        W.HFWhisperDecoderSelfAttention: dict(
            build=lambda cfg, c: W.HFWhisperDecoderSelfAttention(E, cfg[0], is_causal=cfg[1]),
            configs=[(1, True), (2, True), (3, True), (4, False), (6, True), (6, False)],
            params=lambda m, cfg: qkvo(m.self_attn.q_proj, m.self_attn.k_proj, m.self_attn.v_proj,
                                       m.self_attn.out_proj, cfg[0]),
            call=lambda m, x, ctx, **kw: m(x, **kw),
            masks=[V("qk", lambda c: {"attention_mask": c.finfo_min()[:, None]}, real=True),
                   V("qk", lambda c: {"attention_mask": c.bias[:, None]}, real=True)],
            causal=lambda cfg: cfg[1],
        ),
    })

STYLES = list(SPECS)
IDS = [cls.__name__ for cls in STYLES]
HF_STYLES = ("HFLlamaSelfAttention", "HFBartSelfAttention", "HFWhisperDecoderSelfAttention")


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def is_causal(spec, cfg):
    c = spec.get("causal", False)
    return c(cfg) if callable(c) else c


def heads_of(P):
    return P["q"][0].shape[0]


def build(spec, cfg, dtype=torch.float64, ctx_dim=None, seed=0):
    torch.manual_seed(seed)
    return spec["build"](cfg, ctx_dim).to(dtype).eval()


def inputs(b, lq, lk, cross, ctx_dim, gen, dtype=torch.float64):
    x = torch.randn(b, lq, E, generator=gen, dtype=torch.float64).to(dtype)
    ctx = torch.randn(b, lk, ctx_dim, generator=gen, dtype=torch.float64).to(dtype) if cross else None
    return x, ctx


def runs(spec):
    """(cfg, B, Lq, Lk, cross) combinations a style is checked on."""
    for i, cfg in enumerate(spec["configs"]):
        for b, length in SELF_SHAPES:
            yield cfg, b, length, length, False
        if spec.get("cross") and not is_causal(spec, cfg):
            for b, lq, lk in CROSS_SHAPES[i % 2::2]:
                yield cfg, b, lq, lk, True


def check(spec, got, want):
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, **TOL[spec.get("precision", "f64")])


# ---------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------
def test_registry_covers_the_collection():
    assert set(STYLES) == set(W.STYLES)
    assert len(W.STYLES) >= 18
    assert all(hasattr(W, name) for name in HF_STYLES) == W.HAS_TRANSFORMERS
    for cls in W.STYLES:
        assert issubclass(cls, torch.nn.Module)
        assert cls.__doc__ and len(cls.__doc__) > 100, cls.__name__


@pytest.mark.parametrize("cls", STYLES, ids=IDS)
def test_matches_reference_without_mask(cls):
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for cfg, b, lq, lk, cross in runs(spec):
            ctx_dim = spec.get("ctx_dim", E) if cross else None
            m = build(spec, cfg, ctx_dim=ctx_dim)
            P = spec["params"](m, cfg)
            x, ctx = inputs(b, lq, lk, cross, ctx_dim or E, gen)
            want = reference(P, x, x if ctx is None else ctx, causal=is_causal(spec, cfg),
                             rope=spec.get("rope"))
            check(spec, spec["call"](m, x, ctx), want)


@pytest.mark.parametrize("cls", [c for c in STYLES if SPECS[c]["masks"]],
                         ids=[c.__name__ for c in STYLES if SPECS[c]["masks"]])
def test_matches_reference_with_each_mask_form(cls):
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for cfg, b, lq, lk, cross in runs(spec):
            ctx_dim = spec.get("ctx_dim", E) if cross else None
            m = build(spec, cfg, ctx_dim=ctx_dim)
            P = spec["params"](m, cfg)
            for variant in spec["masks"]:
                if cross and variant["self_only"]:
                    continue
                x, ctx = inputs(b, lq, lk, cross, ctx_dim or E, gen)
                case = make_case(variant, b, heads_of(P), lq, lk, gen, torch.float64)
                want = reference(P, x, x if ctx is None else ctx, bias=to_4d(variant["layout"], case.bias),
                                 causal=is_causal(spec, cfg), rope=spec.get("rope"))
                check(spec, spec["call"](m, x, ctx, **variant["kwargs"](case)), want)


@pytest.mark.parametrize("cls", [c for c in STYLES if SPECS[c]["masks"]],
                         ids=[c.__name__ for c in STYLES if SPECS[c]["masks"]])
def test_masked_keys_are_invisible(cls):
    """Large noise at masked key positions leaves every output that cannot see them unchanged:
    all rows for cross-attention, the rows at kept positions for self-attention."""
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(3)
    exact = {"rtol": 0.0, "atol": 1e-12 if spec.get("precision", "f64") == "f64" else 1e-6}
    with torch.no_grad():
        for cfg, b, lq, lk, cross in runs(spec):
            if lk < 2:
                continue
            ctx_dim = spec.get("ctx_dim", E) if cross else None
            m = build(spec, cfg, ctx_dim=ctx_dim)
            h = heads_of(spec["params"](m, cfg))
            for variant in spec["masks"]:
                if cross and variant["self_only"]:
                    continue
                x, ctx = inputs(b, lq, lk, cross, ctx_dim or E, gen)
                case, keys = key_padding_case(variant, b, h, lq, lk, gen, torch.float64)
                kw = variant["kwargs"](case)
                before = spec["call"](m, x, ctx, **kw)
                noise = 50.0 * torch.randn(x.shape if ctx is None else ctx.shape, generator=gen,
                                           dtype=torch.float64) + 20.0
                masked = ~keys[:, :, None]
                if ctx is None:
                    x2, ctx2, rows = torch.where(masked, noise, x), None, keys
                else:
                    x2, ctx2, rows = x, torch.where(masked, noise, ctx), torch.ones(b, lq, dtype=torch.bool)
                after = spec["call"](m, x2, ctx2, **variant["kwargs"](case))
                torch.testing.assert_close(after[rows], before[rows], **exact)
                # without the mask the same noise does change those outputs, where a row can reach it
                reach = rows[:, :, None] & ~keys[:, None, :]
                if is_causal(spec, cfg):
                    reach &= torch.ones(lq, lk, dtype=torch.bool).tril()
                if reach.any():
                    assert not torch.allclose(spec["call"](m, x2, ctx2)[rows], spec["call"](m, x, ctx)[rows])


CAUSAL_STYLES = [c for c in STYLES if any(is_causal(SPECS[c], g) for g in SPECS[c]["configs"])]


@pytest.mark.parametrize("cls", CAUSAL_STYLES, ids=[c.__name__ for c in CAUSAL_STYLES])
def test_causal_styles_ignore_the_future(cls):
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(4)
    exact = {"rtol": 0.0, "atol": 1e-12 if spec.get("precision", "f64") == "f64" else 1e-6}
    with torch.no_grad():
        for cfg in spec["configs"]:
            if not is_causal(spec, cfg):
                continue
            m = build(spec, cfg)
            b, length = 2, 7
            x, _ = inputs(b, length, length, False, E, gen)
            before = spec["call"](m, x, None)
            for t in range(length - 1):
                x2 = x.clone()
                x2[:, t + 1:] = 30.0 * torch.randn(b, length - t - 1, E, generator=gen, dtype=torch.float64)
                after = spec["call"](m, x2, None)
                torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], **exact)
                assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])


@pytest.mark.parametrize("cls", STYLES, ids=IDS)
def test_float32_agrees_with_the_float64_reference(cls):
    spec = SPECS[cls]
    gen = torch.Generator().manual_seed(5)
    cfg = spec["configs"][len(spec["configs"]) // 2]
    b, length = 3, 5
    with torch.no_grad():
        m = build(spec, cfg, dtype=torch.float32)
        P = {k: None if v is None else tuple(t.double() for t in v)
             for k, v in spec["params"](m, cfg).items()}
        x, _ = inputs(b, length, length, False, E, gen, dtype=torch.float32)
        for variant in [None, *spec["masks"]]:
            kw, bias = {}, None
            if variant is not None:
                case = make_case(variant, b, heads_of(P), length, length, gen, torch.float32)
                kw, bias = variant["kwargs"](case), to_4d(variant["layout"], case.bias.double())
            want = reference(P, x.double(), x.double(), bias=bias, causal=is_causal(spec, cfg),
                             rope=spec.get("rope"))
            got = spec["call"](m, x, None, **kw)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), want, **TOL["f32"])


def test_constructors_reject_what_they_cannot_compute():
    with pytest.raises(ValueError, match="even"):
        W.RotarySelfAttention(hidden_size=18, num_heads=2)  # head_dim 9
    with pytest.raises(AssertionError):
        W.LlamaAttentionMeta(dim=18, n_heads=2)
    with pytest.raises(ValueError, match="n_kv_heads"):
        W.GroupedQueryAttention(24, 3)  # n_kv_heads=2 by default
    with pytest.raises(ValueError, match="n_kv_heads"):
        W.GroupedQueryAttention(24, 6, n_kv_heads=4)
    with pytest.raises(ValueError):
        W.BertExtendedMaskSelfAttention(hidden_size=24, num_attention_heads=5)
    W.RotarySelfAttention(hidden_size=24, num_heads=3)  # head_dim 8 is fine
    W.GroupedQueryAttention(24, 6, n_kv_heads=3)
    if W.HAS_TRANSFORMERS:
        with pytest.raises(ValueError, match="even"):
            W.HFLlamaSelfAttention(18, 2)


DROPOUT = {  # how to build a style with attention dropout p, where it has dropout
    W.Qwen2StyleAttention: lambda p: W.Qwen2StyleAttention(E, 3, attention_dropout=p),
    W.MultiHeadedAttention: lambda p: W.MultiHeadedAttention(3, E, dropout=p),
    W.PerceiverAttention: lambda p: W.PerceiverAttention(E, heads=3, dim_head=8, dropout=p),
    W.SeqFirstMultiheadAttention: lambda p: W.SeqFirstMultiheadAttention(E, 3, dropout=p),
    W.Head: lambda p: W.Head(E, 8, dropout=p),
    W.MultiHeadAttention: lambda p: W.MultiHeadAttention(3, 8, E, dropout=p),
    W.RotarySelfAttention: lambda p: W.RotarySelfAttention(E, 3, attention_dropout=p),
    W.BertExtendedMaskSelfAttention: lambda p: W.BertExtendedMaskSelfAttention(E, 3, p),
    W.TorchMHASelfAttention: lambda p: W.TorchMHASelfAttention(E, 3, dropout=p),
    W.TorchMHAPaddingAttention: lambda p: W.TorchMHAPaddingAttention(E, 3, dropout=p),
    W.GroupedQueryAttention: lambda p: W.GroupedQueryAttention(E, 4, dropout=p),
    W.Attention: lambda p: W.Attention(E, num_heads=3, attn_drop=p),
    W.FlashCausalSelfAttention: lambda p: W.FlashCausalSelfAttention(E, 3, dropout=p),
    W.InterleavedQKVAttention: lambda p: W.InterleavedQKVAttention(E, 3, attention_dropout=p),
    W.EinsumProjectionAttention: lambda p: W.EinsumProjectionAttention(E, heads=3, dim_head=8, dropout=p),
}
if W.HAS_TRANSFORMERS:
    DROPOUT[W.HFBartSelfAttention] = lambda p: W.HFBartSelfAttention(E, 3, dropout=p)
    DROPOUT[W.HFWhisperDecoderSelfAttention] = lambda p: W.HFWhisperDecoderSelfAttention(E, 3, dropout=p)


@pytest.mark.parametrize("cls", list(DROPOUT), ids=[c.__name__ for c in DROPOUT])
def test_dropout_acts_in_training_mode_only(cls):
    spec = SPECS[cls]
    x = torch.randn(2, 6, E, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    with torch.no_grad():
        torch.manual_seed(0)
        m = DROPOUT[cls](0.0).double()
        train0 = spec["call"](m.train(), x, None)
        torch.testing.assert_close(train0, spec["call"](m.eval(), x, None), rtol=0, atol=1e-12)
        torch.manual_seed(0)
        m = DROPOUT[cls](0.5).double()
        eval_a, eval_b = spec["call"](m.eval(), x, None), spec["call"](m, x, None)
        torch.testing.assert_close(eval_a, eval_b, rtol=0, atol=0)
        torch.manual_seed(1)
        train_a = spec["call"](m.train(), x, None)
        assert not torch.allclose(train_a, eval_a), "dropout 0.5 in training mode must change the output"
