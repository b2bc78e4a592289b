"""The kv_cache check's hints, on an assignment-style cached self-attention
(``forward(x, past_kv=None) -> (out, (k, v))``) with one bug at a time.

Where the module's full forward (the property's own yardstick) is not causal, no decoding can
match it: the failure names the mistake the causal check names, with the same kind of bug, so a
grade charges that one mistake once; where no mistake is shown (a row that depends on the
sequence's length), none is named. A decode call that raises is said to raise; the cache's axis
is suggested only where the error reads as a shape mismatch.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conformance import Status, infer
from conformance.checks.diagnosis import Bug
from conformance.checks.invariants.kv_cache import GROWS_HINT, _shape_mismatch
from conformance.checks.mask_mistakes import Mistake, kind_of
from conformance.model.declaration_sources import from_mapping
from conformance.run.many import check_many

INTERFACE = {"call": "self", "causal": "always", "width-arg": "d_model", "heads-arg": "num_heads",
             "returns": "tuple", "kv-cache": "returned@past_kv", "output-projection": "applied"}
"""What the example assignment prescribes (examples/kv-cache-assignment/rubric.toml)."""


class CachedSelfAttention(nn.Module):
    """Correct: causal multi-head self-attention returning its cache."""

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split(self, x):
        return x.view(x.shape[0], x.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def grow(self, past, new):
        return torch.cat([past, new], dim=2)

    def future(self, length, total, device):
        return torch.ones(length, total, dtype=torch.bool, device=device).triu(total - length + 1)

    def softmax(self, scores):
        return torch.softmax(scores, dim=-1)

    def forward(self, x, past_kv=None):
        batch, length, _ = x.shape
        q, k, v = (self._split(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        if past_kv is not None:
            k, v = self.grow(past_kv[0], k), self.grow(past_kv[1], v)
        total = k.shape[2]
        scores = (q / math.sqrt(self.head_dim)) @ k.transpose(-2, -1)
        scores = scores.masked_fill(self.future(length, total, x.device), float("-inf"))
        out = (self.softmax(scores) @ v).transpose(1, 2).reshape(batch, length, -1)
        return self.out_proj(out), (k, v)


class NoCausalMask(CachedSelfAttention):
    def future(self, length, total, device):
        return torch.zeros(length, total, dtype=torch.bool, device=device)


class SoftmaxOverQueries(CachedSelfAttention):
    def softmax(self, scores):
        return torch.softmax(scores, dim=-2)


class LengthScaled(CachedSelfAttention):
    """Causal, but every row scaled by the length of the call: no decoding can know it."""

    def forward(self, x, past_kv=None):
        out, cache = super().forward(x, past_kv)
        return out * (1 + 0.1 * x.shape[1]), cache


class DecodeRaises(CachedSelfAttention):
    def grow(self, past, new):
        raise KeyError("past_kv layer 0")


class CacheOnHeadAxis(CachedSelfAttention):
    def grow(self, past, new):
        return torch.cat([past, new], dim=1)


def _results(cls: type[nn.Module], checks=("causal", "kv_cache")):
    implementation = infer(cls, declared=from_mapping(INTERFACE, "test")).implementation
    results = check_many([(cls.__name__, implementation)], devices=["cpu"], checks=list(checks))
    return {result.check: result for result in results}


def test_the_correct_module_passes_both_checks():
    results = _results(CachedSelfAttention)
    assert {check: r.status for check, r in results.items()} == {
        "causal": Status.PASSED, "kv_cache": Status.PASSED}, {c: r.reason for c, r in results.items()}


NOT_CAUSAL = pytest.mark.parametrize(("cls", "kind"), [
    (NoCausalMask, kind_of(Mistake.IGNORES_CAUSAL)),
    (SoftmaxOverQueries, Bug.SOFTMAX_OVER_QUERIES.value),
], ids=["no-causal-mask", "softmax-over-queries"])


@NOT_CAUSAL
def test_the_causal_check_names_the_mistake_with_its_kind(cls, kind):
    causal = _results(cls, checks=("causal",))["causal"]
    assert causal.status is Status.FAILED
    assert causal.bug == kind, causal.hint


@NOT_CAUSAL
def test_a_forward_that_is_not_causal_is_named_by_kv_cache_as_by_causal(cls, kind):
    results = _results(cls)
    causal, cache = results["causal"], results["kv_cache"]
    assert cache.status is Status.FAILED
    assert "the full forward is not causal" in (cache.hint or ""), (cache.reason, cache.hint)
    assert cache.bug == causal.bug == kind
    assert str(causal.hint) in cache.hint  # the same mistake, in the same words


def test_a_forward_that_depends_on_the_length_is_not_named_a_causal_mistake():
    results = _results(LengthScaled)
    assert results["causal"].status is Status.PASSED
    cache = results["kv_cache"]
    assert cache.status is Status.FAILED
    assert "or on the sequence's length?" in (cache.hint or ""), cache.hint
    assert cache.bug is None


def test_a_decode_call_that_raises_something_else_is_not_blamed_on_the_cache_axis():
    cache = _results(DecodeRaises, checks=("kv_cache",))["kv_cache"]
    assert cache.status is Status.FAILED
    assert "raised: KeyError: 'past_kv layer 0'" in cache.reason
    assert cache.hint is None


def test_a_shape_mismatch_in_a_decode_call_suggests_the_cache_axis():
    cache = _results(CacheOnHeadAxis, checks=("kv_cache",))["kv_cache"]
    assert cache.status is Status.FAILED and "raised: RuntimeError" in cache.reason
    assert cache.hint == GROWS_HINT


@pytest.mark.parametrize(("message", "shape"), [
    ("RuntimeError: Sizes of tensors must match except in dimension 1. Expected size 4", True),
    ("RuntimeError: The size of tensor a (3) must match the size of tensor b (5) at "
     "non-singleton dimension 3", True),
    ("RuntimeError: mat1 and mat2 shapes cannot be multiplied (2x8 and 4x8)", True),
    ("IndexError: Dimension out of range (expected to be in range of [-3, 2], but got 3)", True),
    ("RuntimeError: cache corrupted, dump follows: root:x:0:0:root:/root:/bin/bash", False),
    ("KeyError: 'past_kv layer 0'", False),
    ("TypeError: forward() got an unexpected keyword argument 'size'", False),
])
def test_what_reads_as_a_shape_mismatch(message, shape):
    assert _shape_mismatch(message) is shape


class MergedHeadsCache(CachedSelfAttention):
    """Correct attention; its cache keeps the heads merged: (B, L, d_model) each."""

    def forward(self, x, past_kv=None):
        batch = x.shape[0]
        split = None if past_kv is None else tuple(
            part.view(batch, part.shape[1], self.num_heads, self.head_dim).transpose(1, 2)
            for part in past_kv)
        out, (k, v) = super().forward(x, split)
        return out, tuple(part.transpose(1, 2).reshape(batch, part.shape[2], -1)
                          for part in (k, v))


@pytest.mark.parametrize(("cls", "layout", "holds"), [
    (CachedSelfAttention, "bhld", True), (CachedSelfAttention, "blhd", False),
    (CachedSelfAttention, "bld", False), (MergedHeadsCache, "bld", True),
    (MergedHeadsCache, "bhld", False), (MergedHeadsCache, None, True)])
def test_a_declared_cache_layout_holds_the_cache_to_it(cls, layout, holds):
    """cache-layout: a returned cache in another form fails kv_cache, saying both forms and
    naming the bug; one in the declared form (or with none declared) is judged on decoding."""
    interface = {**INTERFACE, **({"cache-layout": layout} if layout else {})}
    implementation = infer(cls, declared=from_mapping(interface, "test")).implementation
    (result,) = check_many([(cls.__name__, implementation)], devices=["cpu"],
                           checks=["kv_cache"])
    if holds:
        assert result.status is Status.PASSED, result.reason
        return
    assert result.status is Status.FAILED
    assert f"not the declared layout {layout}: (k, v), each" in result.reason
    assert result.bug == Bug.CACHE_LAYOUT.value


def test_a_cache_layout_for_a_cache_not_returned_is_one_line():
    from conformance.model.declarations import DeclarationError, Declarations

    with pytest.raises(DeclarationError, match="the form of a returned cache"):
        Declarations(kv_cache="buffers@start_pos", cache_layout="bhld").cache_layout_form()
    with pytest.raises(DeclarationError, match="use bhld, blhd or bld"):
        Declarations(cache_layout="hbld").cache_layout_form()
