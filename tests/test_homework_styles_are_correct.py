"""Proof that every submission in tests/fixtures/homework_styles.py is correct multi-head attention.

The assignment: `MultiHeadAttention(d_model, num_heads)`, `forward(x, mask=None)` with x (B, L, d_model)
and an optional keep-mask (B, L) (1/True = real token, 0/False = padding), returning (B, L, d_model):
softmax(q k^T / sqrt(head_dim) with padding keys masked) v per head, heads concatenated, output
projection.

Each module is compared, in float64, with a reference written here from scratch: the oracle knows
each style's projection names and reads the module's own weights by name (for the fused GPT-NeoX
style it undoes the per-head [q_h, k_h, v_h] interleave itself), then computes the projections, the
scores, an explicit max-subtracted softmax and the context with einsum, heads concatenated, output
projection applied. Agreement is checked at 1e-10 relative, without a mask and with keep-masks (bool,
integer and float 1/0) whose kept keys are scattered (key 0 always kept, a masked key before a kept
one); with a mask only the rows of kept query positions are compared, since what a style returns at a
padded query position is not specified.

Besides that: padded keys are invisible (large noise written into x at padded positions leaves the
kept rows unchanged, where without the mask the same noise does change them), float32 runs agree with
the float64 reference at 1e-4, and every class has exactly the assignment's signatures.

Nothing here uses the project's conformance package.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from tests.fixtures import homework_styles as H

CONFIGS = [(8, 2), (16, 4)]  # (d_model, num_heads)
SHAPES = [(2, 5), (3, 7), (1, 9)]  # (B, L)
CASES = [(d, h, b, length) for d, h in CONFIGS for b, length in SHAPES]
CASE_IDS = [f"d{d}h{h}-B{b}L{length}" for d, h, b, length in CASES]
F64 = {"rtol": 1e-10, "atol": 1e-12}
F32 = {"rtol": 1e-4, "atol": 1e-4}
MASK_DTYPES = [torch.bool, torch.long, torch.float32]


# ---------------------------------------------------------------------------------------------
# Reading each style's weights by name: {"q"|"k"|"v"|"o": (weight (out, in), bias (out,))}, with
# the q/k/v weights in the plain layout (rows h * head_dim .. (h + 1) * head_dim belong to head h)
# ---------------------------------------------------------------------------------------------
def wb(layer):
    weight = layer.weight.detach()
    bias = torch.zeros(weight.shape[0], dtype=weight.dtype) if layer.bias is None else layer.bias.detach()
    return weight, bias


def named(q, k, v, o):
    return lambda m: {"q": wb(getattr(m, q)), "k": wb(getattr(m, k)), "v": wb(getattr(m, v)),
                      "o": wb(getattr(m, o))}


def annotated(m):
    return {"q": wb(m.linears[0]), "k": wb(m.linears[1]), "v": wb(m.linears[2]), "o": wb(m.linears[-1])}


def neox(m):
    """to_qkv rows are [q_0, k_0, v_0, q_1, k_1, v_1, ...] in head_dim blocks."""
    weight, bias = wb(m.to_qkv)
    d_model = weight.shape[1]
    heads = m.num_heads
    w = weight.reshape(heads, 3, d_model // heads, d_model)
    b = bias.reshape(heads, 3, d_model // heads)
    return {name: (w[:, i].reshape(d_model, d_model), b[:, i].reshape(d_model))
            for i, name in enumerate("qkv")} | {"o": wb(m.to_out)}


def neox_read_as_thirds(m):
    """The wrong reading of to_qkv (three contiguous thirds): used to show the interleave matters."""
    weight, bias = wb(m.to_qkv)
    ws, bs = weight.chunk(3), bias.chunk(3)
    return {name: (ws[i], bs[i]) for i, name in enumerate("qkv")} | {"o": wb(m.to_out)}


PARAMS = {
    H.ProjMultiHeadAttention: named("query_proj", "key_proj", "value_proj", "out_proj"),
    H.BiaslessMultiHeadAttention: named("W_query", "W_key", "W_value", "W_out"),
    H.MathNamesAttention: named("Wq", "Wk", "Wv", "Wo"),
    H.DistilBertLikeAttention: named("q_lin", "k_lin", "v_lin", "out_lin"),
    H.EinsumAttention: named("proj_q", "proj_k", "proj_v", "proj_out"),
    H.HeadLoopAttention: named("lin_q", "lin_k", "lin_v", "lin_o"),
    H.PerssonSelfAttention: named("queries", "keys", "values", "fc_out"),
    H.CapitalLettersAttention: named("Q", "K", "V", "O"),
    H.AnnotatedMultiHeadedAttention: annotated,
    H.NeoXFusedAttention: neox,
}
IDS = [c.__name__ for c in H.STYLES]


# ---------------------------------------------------------------------------------------------
# The reference
# ---------------------------------------------------------------------------------------------
def reference(P, x, heads, keep=None):
    """x (B, L, E) float64; keep (B, L) bool or None. Multi-head self-attention with padded keys
    masked, computed with einsum and an explicit max-subtracted softmax."""
    b, length, _ = x.shape
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = P["q"], P["k"], P["v"], P["o"]
    q = (torch.einsum("bld,ed->ble", x, wq) + bq).reshape(b, length, heads, -1)
    k = (torch.einsum("bld,ed->ble", x, wk) + bk).reshape(b, length, heads, -1)
    v = (torch.einsum("bld,ed->ble", x, wv) + bv).reshape(b, length, heads, -1)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    if keep is not None:
        s = s.masked_fill(~keep[:, None, None, :], float("-inf"))
    s = s - s.amax(dim=-1, keepdim=True)
    p = s.exp()
    p = p / p.sum(dim=-1, keepdim=True)
    ctx = torch.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, length, -1)
    return torch.einsum("ble,oe->blo", ctx, wo) + bo


# ---------------------------------------------------------------------------------------------
# Building modules and inputs
# ---------------------------------------------------------------------------------------------
def build(cls, d_model, heads, seed, dtype=torch.float64):
    """The module in eval mode, its parameters redrawn (weights and biases of order 1/sqrt(d_model)
    up to a few times that) so that every projection and bias matters."""
    torch.manual_seed(seed)
    m = cls(d_model, heads)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * 1.5 / math.sqrt(d_model))
    return m.to(dtype).eval()


def keep_mask(b, length, gen):
    """(B, L) bool keep-mask: scattered kept keys, key 0 always kept, key 1 masked and key 2 kept (a
    masked key before a kept one); the rest random, so some rows also end in padding."""
    keep = torch.rand(b, length, generator=gen) < 0.5
    keep[:, 0], keep[:, 1], keep[:, 2] = True, False, True
    return keep


def inputs(b, length, d_model, seed):
    gen = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(b, length, d_model, generator=gen, dtype=torch.float64)
    return x, keep_mask(b, length, gen), gen


def seed_of(cls, case):
    return 17 * H.STYLES.index(cls) + CASES.index(case)


# ---------------------------------------------------------------------------------------------
# The submissions are what the assignment asked for
# ---------------------------------------------------------------------------------------------
def test_ten_styles_all_read_by_the_reference():
    assert len(H.STYLES) == 10 and len(set(H.STYLES)) == 10
    assert set(PARAMS) == set(H.STYLES)


@pytest.mark.parametrize("cls", H.STYLES, ids=IDS)
def test_signatures_are_the_assignments(cls):
    init = list(inspect.signature(cls.__init__).parameters.values())
    assert [p.name for p in init[:3]] == ["self", "d_model", "num_heads"]
    assert all(p.default is inspect.Parameter.empty for p in init[1:3])
    assert [(p.name, p.default) for p in init[3:]] in ([], [("dropout", 0.0)])
    fwd = list(inspect.signature(cls.forward).parameters.values())
    assert [(p.name, p.default) for p in fwd] == [
        ("self", inspect.Parameter.empty), ("x", inspect.Parameter.empty), ("mask", None)]
    assert cls.__doc__ and cls.__doc__.strip()


# ---------------------------------------------------------------------------------------------
# Agreement with the reference
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", H.STYLES, ids=IDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matches_reference_without_mask(cls, case):
    d_model, heads, b, length = case
    m = build(cls, d_model, heads, seed_of(cls, case))
    x, _, _ = inputs(b, length, d_model, seed_of(cls, case))
    with torch.no_grad():
        got = m(x)
    assert isinstance(got, torch.Tensor) and got.shape == (b, length, d_model) and got.dtype == torch.float64
    torch.testing.assert_close(got, reference(PARAMS[cls](m), x, heads), **F64)


@pytest.mark.parametrize("cls", H.STYLES, ids=IDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matches_reference_with_keep_mask(cls, case):
    d_model, heads, b, length = case
    m = build(cls, d_model, heads, seed_of(cls, case))
    x, keep, _ = inputs(b, length, d_model, seed_of(cls, case))
    P = PARAMS[cls](m)
    want = reference(P, x, heads, keep)
    for dtype in MASK_DTYPES:
        with torch.no_grad():
            got = m(x, keep.to(dtype))
        assert got.shape == (b, length, d_model)
        torch.testing.assert_close(got[keep], want[keep], **F64, msg=lambda s, d=dtype: f"{d}: {s}")
    # the mask is not vacuous: without it the kept rows come out different
    assert not torch.allclose(reference(P, x, heads)[keep], want[keep], rtol=1e-6, atol=1e-6)


def test_neox_interleave_is_what_the_module_computes():
    """Reading to_qkv as three contiguous thirds gives a different answer: the oracle's per-head
    interleave is not a no-op."""
    m = build(H.NeoXFusedAttention, 16, 4, 0)
    x, _, _ = inputs(2, 5, 16, 0)
    with torch.no_grad():
        got = m(x)
    torch.testing.assert_close(got, reference(neox(m), x, 4), **F64)
    assert not torch.allclose(got, reference(neox_read_as_thirds(m), x, 4), rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# Padded keys are invisible
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", H.STYLES, ids=IDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_padded_keys_are_invisible(cls, case):
    d_model, heads, b, length = case
    m = build(cls, d_model, heads, seed_of(cls, case))
    x, keep, gen = inputs(b, length, d_model, seed_of(cls, case))
    noise = 100.0 * torch.randn(x.shape, generator=gen, dtype=torch.float64)
    x_noisy = torch.where(keep[..., None], x, noise)
    with torch.no_grad():
        clean, noisy = m(x, keep), m(x_noisy, keep)
        unmasked_clean, unmasked_noisy = m(x), m(x_noisy)
    torch.testing.assert_close(noisy[keep], clean[keep], **F64)
    torch.testing.assert_close(noisy[keep], reference(PARAMS[cls](m), x_noisy, heads, keep)[keep], **F64)
    # without the mask the same noise reaches the kept rows
    assert not torch.allclose(unmasked_noisy[keep], unmasked_clean[keep], rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# float32
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", H.STYLES, ids=IDS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_float32_agrees_with_the_float64_reference(cls, case):
    d_model, heads, b, length = case
    m64 = build(cls, d_model, heads, seed_of(cls, case))
    m32 = build(cls, d_model, heads, seed_of(cls, case), dtype=torch.float32)
    x, keep, _ = inputs(b, length, d_model, seed_of(cls, case))
    P = PARAMS[cls](m64)
    with torch.no_grad():
        plain, masked = m32(x.float()), m32(x.float(), keep)
    assert plain.dtype == torch.float32 and masked.dtype == torch.float32
    torch.testing.assert_close(plain.double(), reference(P, x, heads), **F32)
    torch.testing.assert_close(masked.double()[keep], reference(P, x, heads, keep)[keep], **F32)
