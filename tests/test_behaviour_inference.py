"""Inference decided by behaviour: the weights found by reproducing a module's own output, the
position encoding that reproduces it, mask conventions confirmed by the properties of a mask,
constraints from the forward, the heads' axis of a core function."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conformance import Status, check
from conformance.inference import Declarations, infer, infer_function
from conformance.model.forms import AlibiBias, PositionEncoding, Rotary
from conformance.model.layouts import ArrangedProjection, RelabelledHeads, role_rows
from conformance.model.remedies import texts
from conformance.numerics.position_encoding import encode, head_slopes, standard_slopes


def _softmax_attention(q, k, v, causal=False, keep=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if keep is not None:
        scores = scores.masked_fill(~keep[:, None, None, :].bool(), float("-inf"))
    if causal:
        future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(-1) @ v


class NeoXFused(nn.Module):
    """One fused linear whose rows are per head [q_h; k_h; v_h] (GPT-NeoX, BLOOM), with
    weights named nothing a list knows."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.mixer = nn.Linear(d_model, 3 * d_model)
        self.back = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, n, _ = x.shape
        qkv = self.mixer(x).view(b, n, self.h, -1)
        q, k, v = (t.transpose(1, 2) for t in qkv.chunk(3, dim=-1))
        return self.back(_softmax_attention(q, k, v).transpose(1, 2).reshape(b, n, -1))


class PerGroupFused(nn.Module):
    """Falcon's new decoder architecture: per key/value group, G query heads then k then v."""

    def __init__(self, d_model, num_heads, num_kv_heads=None):
        super().__init__()
        self.h, self.kv = num_heads, num_kv_heads or num_heads
        self.dh = d_model // num_heads
        self.query_key_value = nn.Linear(d_model, (self.h + 2 * self.kv) * self.dh)
        self.dense = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, n, _ = x.shape
        group = self.h // self.kv
        qkv = self.query_key_value(x).view(b, n, self.kv, group + 2, self.dh)
        q = qkv[:, :, :, :group].reshape(b, n, self.h, self.dh).transpose(1, 2)
        k = qkv[:, :, :, group].transpose(1, 2).repeat_interleave(group, dim=1)
        v = qkv[:, :, :, group + 1].transpose(1, 2).repeat_interleave(group, dim=1)
        return self.dense(_softmax_attention(q, k, v).transpose(1, 2).reshape(b, n, -1))


class TiledGroups(nn.Module):
    """Grouped-query heads expanded with repeat: query head h reads key/value head h mod Hkv."""

    def __init__(self, d_model, num_heads, kv_heads=None):
        super().__init__()
        self.h, self.kv = num_heads, kv_heads or num_heads
        self.dh = d_model // num_heads
        self.to_q = nn.Linear(d_model, d_model)
        self.to_k = nn.Linear(d_model, self.kv * self.dh)
        self.to_v = nn.Linear(d_model, self.kv * self.dh)
        self.to_out = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.to_q(x).view(b, n, self.h, self.dh).transpose(1, 2)
        k, v = (p(x).view(b, n, self.kv, self.dh).transpose(1, 2).repeat(1, self.h // self.kv,
                                                                           1, 1)
                for p in (self.to_k, self.to_v))
        return self.to_out(_softmax_attention(q, k, v).transpose(1, 2).reshape(b, n, -1))


class RotaryInForward(nn.Module):
    """RoPE (interleaved pairs, theta 500000) computed in the forward, no buffer, no position
    argument; its odd head widths only fail when the forward runs."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.c_attn(x).split(d, -1))
        dh = q.shape[-1]
        if dh % 2:
            raise ValueError(f"RoPE needs an even head width, got {dh}")
        freqs = 500000.0 ** (-torch.arange(0, dh, 2, dtype=x.dtype) / dh)
        angle = torch.arange(n, dtype=x.dtype)[:, None] * freqs
        cos, sin = angle.cos(), angle.sin()

        def turn(t):
            a, c = t[..., 0::2], t[..., 1::2]
            return torch.stack([a * cos - c * sin, a * sin + c * cos], dim=-1).flatten(-2)

        out = _softmax_attention(turn(q), turn(k), v, causal=True)
        return self.c_proj(out.transpose(1, 2).reshape(b, n, d))


class WholeMaskOnly(nn.Module):
    """Causal; a given attention_mask is the whole mask (B, L, L), causality included (as
    torchtune's and HuggingFace's 4-D masks are)."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, attention_mask=None):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        if attention_mask is None:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=attention_mask[:, None].bool())
        return self.out(out.transpose(1, 2).reshape(b, n, d))


class ZeroedPaddedQueries(nn.Module):
    """Correct attention that zeroes its output at padded query positions (x-transformers,
    FlashAttention's unpadding): unspecified, so never judged unless declared."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, mask=None):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        out = self.out(_softmax_attention(q, k, v, keep=mask).transpose(1, 2).reshape(b, n, d))
        return out if mask is None else out * mask[:, :, None]


def blhd_attention(q, k, v, causal=False, softmax_scale=None):
    """A kernel author's function in FlashAttention's layout (batch, length, heads, dim)."""
    scale = softmax_scale or q.shape[-1] ** -0.5
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        scores = scores.masked_fill(torch.ones(q.shape[1], k.shape[1], dtype=torch.bool).triu(1),
                                    float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)


def _note(inferred, start: str) -> str:
    found = [note for note in texts(inferred.notes) if note.startswith(start)]
    assert found, (start, texts(inferred.notes))
    return found[0]


def test_role_rows_per_head_and_per_group():
    rows = role_rows("per_head", "qkv", heads=2, kv_heads=2, head_dim=2)
    assert rows["q"].tolist() == [0, 1, 6, 7] and rows["v"].tolist() == [4, 5, 10, 11]
    rows = role_rows("per_group", "qkv", heads=4, kv_heads=2, head_dim=1)
    assert rows["q"].tolist() == [0, 1, 4, 5] and rows["k"].tolist() == [2, 6]


def test_a_fused_layer_arranged_per_head_is_found_by_behaviour():
    inferred = infer(NeoXFused)
    layout = inferred.implementation.weight_layout
    assert layout == ArrangedProjection("inner.mixer", "per_head", "qkv", "inner.back")
    assert "found by behaviour" in _note(inferred, "weights:")
    verdicts = {r.check: r.status for r in check(inferred.implementation, devices=["cpu"],
                                                  checks=["reference", "head_split", "scale"])}
    assert set(verdicts.values()) == {Status.PASSED}


def test_a_fused_layer_arranged_per_group_reads_grouped_heads():
    inferred = infer(PerGroupFused)
    assert inferred.implementation.weight_layout.arrangement == "per_group"
    assert inferred.implementation.capabilities.kv_heads == "config"
    verdicts = {r.check: r.status for r in check(inferred.implementation, devices=["cpu"],
                                                  checks=["reference", "kv_groups"])}
    assert set(verdicts.values()) == {Status.PASSED}


def test_tiled_grouping_warns_bare_and_fails_when_interleaved_is_declared():
    bare = infer(TiledGroups).implementation
    assert isinstance(bare.weight_layout, RelabelledHeads)
    results = {r.check: r for r in check(bare, devices=["cpu"], checks=["kv_groups",
                                                                        "reference"])}
    assert results["kv_groups"].status is Status.WARNED
    assert "h mod Hkv (tiled" in results["kv_groups"].reason
    # What to declare is data, not a flag in the text: each front end says it its own way.
    assert "--" not in (results["kv_groups"].hint or "")
    assert {(o.declaration, o.value) for o in results["kv_groups"].remedy.options} == {
        ("kv_grouping", "interleaved"), ("kv_grouping", "tiled")}
    assert results["reference"].status is Status.PASSED
    declared = infer(TiledGroups, declared=Declarations(kv_grouping="interleaved")).implementation
    (result,) = check(declared, devices=["cpu"], checks=["kv_groups"])
    assert result.status is Status.FAILED
    assert "repeat" in result.hint


def test_rope_in_the_forward_is_measured_and_its_constraint_found():
    # float32 and float64: in float16 its RoPE angles, computed in float16, are coarse.
    inferred = infer(RotaryInForward, declared=Declarations(dtypes="float32,float64"))
    caps = inferred.implementation.capabilities
    assert caps.position.encoding == PositionEncoding(rotary=Rotary("interleaved", 500000.0))
    assert any("builds and runs only with an even head_dim" in n for n in texts(inferred.notes))
    results = check(inferred.implementation, devices=["cpu"],
                    checks=["reference", "head_split", "scale", "stability"])
    assert {r.status for r in results} == {Status.PASSED}


def test_rope_held_to_the_theta_it_states():
    from conformance.implementations.mutants.rope_theta_exponent import RopeThetaExponent

    inferred = infer(RopeThetaExponent)
    assert "theta 100 where it states 10000" in _note(inferred, "RoPE: its output is reproduced")
    (result,) = check(inferred.implementation, devices=["cpu"], checks=["reference"])
    assert result.status is Status.FAILED
    assert "theta 100 instead of 10000" in result.hint


def test_a_whole_mask_carries_causality_and_a_padding_mask_is_preferred():
    inferred = infer(WholeMaskOnly)
    mask = inferred.implementation.capabilities.mask
    assert mask.carries_causality and mask.layout.value == "per_query"
    results = check(inferred.implementation, devices=["cpu"], checks=["padding", "causal"])
    assert {r.status for r in results} == {Status.PASSED}


def test_the_mask_forms_passed_over_are_said_with_what_they_did():
    said = _note(infer(WholeMaskOnly), "attention_mask: ")
    assert "forms tried before it: " in said
    # Each outcome once, with the forms that gave it.
    assert ("int mask, 0 = masked, shape (B, Lk) and bool mask, True = attend, shape (B, Lk) "
            "run, but a mask that keeps every key changes the output; 4 more") in said
    assert said.count("a mask that keeps every key changes the output") == 1
    assert "shapes (B, 1, 1, Lk), (B, 1, Lq, Lk) raise in every form tried" in said
    first = _note(infer(KeyPaddingFirst), "attention_mask: ")  # the first form tried works
    assert "forms tried before it" not in first


class KeyPaddingFirst(WholeMaskOnly):
    """Not causal; a (B, Lk) attention_mask, 1 = attend: the first form the search tries."""

    def forward(self, x, attention_mask=None):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.h, -1).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(out.transpose(1, 2).reshape(b, n, d))


def test_a_padding_mask_that_drops_causality_is_assumed_and_caught():
    from conformance.implementations.mutants.mask_drops_causality import MaskDropsCausality

    caps = infer(MaskDropsCausality).implementation.capabilities
    assert caps.mask.layout.value == "key_padding" and "no longer causal" in caps.doubts.mask_assumed


def test_the_only_convention_that_runs_leaks_and_padding_shows_it():
    from conformance.implementations.mutants.mask_on_query_axis import MaskOnQueryAxis

    impl = infer(MaskOnQueryAxis).implementation
    assert "masked keys leak" in impl.capabilities.doubts.mask_assumed
    (result,) = check(impl, devices=["cpu"], checks=["padding"])
    assert result.status is Status.FAILED
    assert result.reason.startswith("changing key/value inputs at masked positions changed")
    assert any(d.startswith("the mask convention was assumed") for d in result.details)


def test_padded_queries_are_unjudged_unless_declared():
    bare = infer(ZeroedPaddedQueries).implementation
    results = check(bare, devices=["cpu"], checks=["padding", "reference", "head_split"])
    assert {r.status for r in results} == {Status.PASSED}
    zero = infer(ZeroedPaddedQueries, declared=Declarations(padded_queries="zero"))
    (result,) = check(zero.implementation, devices=["cpu"], checks=["padding"])
    assert result.status is Status.PASSED
    any_row = infer(ZeroedPaddedQueries, declared=Declarations(padded_queries="any"))
    (result,) = check(any_row.implementation, devices=["cpu"], checks=["reference"])
    assert result.status is Status.FAILED


def test_a_kernel_in_flash_attention_layout_is_probed_and_passes():
    inferred = infer_function(blhd_attention)
    assert texts(inferred.notes)[0].startswith("core function over (batch, length, heads, head_dim) "
                                        "(probed")
    results = check(inferred.implementation, devices=["cpu"],
                    checks=["head_split", "reference", "causal", "batch_independence"])
    assert {r.status for r in results} == {Status.PASSED}
    declared = infer_function(blhd_attention, declared=Declarations(layout="bhld"))
    (result,) = check(declared.implementation, devices=["cpu"], checks=["reference"])
    assert result.status is Status.FAILED


def test_returns_tensor_declared_fails_a_tuple_at_the_gate():
    class ReturnsTuple(NeoXFused):
        def forward(self, x):
            return super().forward(x), None

    inferred = infer(ReturnsTuple, declared=Declarations(returns="tensor"))
    (result,) = check(inferred.implementation, devices=["cpu"], checks=["gate"])
    assert result.status is Status.FAILED
    assert "tuple" in result.reason


def test_batch_first_declared_is_never_read_sequence_first():
    class SequenceFirstMHA(nn.Module):
        def __init__(self, embed_dim, num_heads):
            super().__init__()
            self.attn = nn.MultiheadAttention(embed_dim, num_heads)

        def forward(self, x):
            return self.attn(x, x, x, need_weights=False)[0]

    assert "inputs are (length, batch, width) (probed" in " ".join(
        texts(infer(SequenceFirstMHA).notes))
    declared = infer(SequenceFirstMHA, declared=Declarations(batch_first="true"))
    (result,) = check(declared.implementation, devices=["cpu"], checks=["batch_independence"])
    assert result.status is Status.FAILED


def test_rope_is_relative_and_alibi_slopes_follow_a_tiled_grouping():
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 5, 8, generator=generator, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 8, generator=generator, dtype=torch.float64)
    for pairing in ("half", "interleaved"):
        encoding = PositionEncoding(rotary=Rotary(pairing, 10000.0, fraction=0.5))
        at_zero = [t @ u.transpose(-1, -2) for t, u in [encode(q, k, encoding, None, 0)[:2]]]
        at_seven = [t @ u.transpose(-1, -2) for t, u in [encode(q, k, encoding, None, 7)[:2]]]
        torch.testing.assert_close(at_zero[0], at_seven[0])
        rotated, _, _ = encode(q, k, encoding, None, 3)
        torch.testing.assert_close(rotated[..., 4:], q[..., 4:])  # the other half passes through
    assert standard_slopes(4) == [0.25, 0.0625, 0.015625, 0.00390625]
    slopes = head_slopes(AlibiBias(tiled=True), 4, 2)
    assert slopes == [0.25, 0.015625, 0.0625, 0.00390625]


@pytest.mark.parametrize("declared", ["kv_grouping", "padded_queries", "returns", "layout"])
def test_a_misspelled_choice_is_one_clear_line(declared):
    from conformance.inference import InferenceError

    with pytest.raises(InferenceError, match=f"{declared.replace('_', '-')} 'nonsense': use"):
        target = blhd_attention if declared == "layout" else NeoXFused
        (infer_function if declared == "layout" else infer)(
            target, declared=Declarations(**{declared: "nonsense"}))
