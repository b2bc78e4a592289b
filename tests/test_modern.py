"""The modern forms' pieces: grouped canonical weights and reference, windows, per-query masks,
positions and packing arguments, the cache session, declarations, inference of a fixed
key/value head count, the decode benchmark."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conformance import (
    CacheForm,
    CacheStyle,
    Capabilities,
    CausalForm,
    Implementation,
    PackedForm,
    PositionForm,
)
from conformance.benchmark.decode import decode_bench, decode_table
from conformance.checks.diagnosis import tiled_groups
from conformance.generation.cases import Case
from conformance.implementations.modern import IMPLEMENTATIONS, LlamaAttention, VarlenAttention
from conformance.inference import Declarations, InferenceError, infer
from conformance.model.declarations import DeclarationError
from conformance.model.declared_layouts import FusedProjection, SeparateProjections
from conformance.model.mask_forms import MaskConvention, MaskKind, MaskLayout
from conformance.model.remedies import texts
from conformance.model.spec import Config
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import allowed_keys, reference_attention
from conformance.subject.boundary import CapabilityError, ImplementationError, Inputs
from conformance.subject.call_arguments import block_diagonal, cu_seqlens, positions_argument
from conformance.subject.in_process import InProcessSubject
from conformance.subject.masks import MaskEncodingError, encode_mask

MODERN = {impl.name: impl for impl in IMPLEMENTATIONS}


def grouped_weights(heads=4, kv_heads=2, head_dim=3, d_model=12, seed=0) -> HeadWeights:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return HeadWeights(w_q=randn(heads, head_dim, d_model), b_q=randn(heads, head_dim),
                       w_k=randn(kv_heads, head_dim, d_model), b_k=randn(kv_heads, head_dim),
                       w_v=randn(kv_heads, head_dim, d_model), b_v=randn(kv_heads, head_dim),
                       w_o=randn(d_model, heads * head_dim), b_o=randn(d_model))


def test_grouped_weights_read_from_projections_of_fewer_heads():
    module = LlamaAttention(16, 4, num_kv_heads=2)
    weights = SeparateProjections("q_proj", "k_proj", "v_proj", "o_proj").read(module, 4)
    assert (weights.num_heads, weights.num_kv_heads, weights.group) == (4, 2, 2)
    assert [weights.kv_head(h) for h in range(4)] == [0, 0, 1, 1]
    fused = VarlenAttention(16, 4, num_kv_heads=1)
    read = FusedProjection("qkv", "out").read(fused, 4, 1)
    assert tuple(read.w_k.shape) == (1, 4, 16) and tuple(read.w_q.shape) == (4, 4, 16)


def test_the_grouped_reference_repeats_each_key_value_head_for_its_group():
    weights = grouped_weights()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    by_hand = weights.expanded()
    assert torch.equal(by_hand.w_k[1], weights.w_k[0]) and torch.equal(by_hand.w_k[2],
                                                                        weights.w_k[1])
    torch.testing.assert_close(reference_attention(weights, x, x, x).output,
                               reference_attention(by_hand, x, x, x).output)
    tiled = tiled_groups(weights)  # what repeat (not repeat_interleave) pairs: h with h mod 2
    assert torch.equal(tiled.w_k[1], weights.w_k[1]) and torch.equal(tiled.w_k[2],
                                                                      weights.w_k[0])


def test_relabelling_grouped_heads_moves_whole_groups():
    weights = grouped_weights()
    moved = weights.permute_heads([3, 2, 1, 0])  # group 1 first, heads swapped within
    assert torch.equal(moved.w_k[0], weights.w_k[1]) and torch.equal(moved.w_q[0],
                                                                     weights.w_q[3])
    with pytest.raises(ValueError, match="splits a group"):
        weights.permute_heads([0, 2, 1, 3])


def test_a_window_keeps_the_last_w_keys_of_each_causal_row():
    allowed = allowed_keys(1, 5, 5, None, True, window=2)[0, 0]
    assert allowed.tolist()[4] == [False, False, False, True, True]
    assert allowed.tolist()[0] == [True, False, False, False, False]


def test_per_query_masks_go_only_into_layouts_with_a_query_axis():
    keep = block_diagonal((2, 3), batch=2, causal=False, device="cpu")
    assert keep.shape == (2, 5, 5) and not bool(keep[0, 0, 2]) and bool(keep[0, 4, 2])
    per_query = encode_mask(keep, MaskConvention(MaskKind.KEEP_INT, MaskLayout.PER_QUERY),
                            num_heads=2, q_len=5, dtype=torch.float32)
    assert per_query.dtype == torch.int64 and tuple(per_query.shape) == (2, 5, 5)
    with pytest.raises(MaskEncodingError, match="has no query axis"):
        encode_mask(keep, MaskConvention(MaskKind.KEEP_INT, MaskLayout.KEY_PADDING),
                    num_heads=2, q_len=5, dtype=torch.float32)


def test_positions_and_cu_seqlens_in_their_forms():
    assert positions_argument(PositionForm.START, 7, 2, 3, "cpu") == 7
    assert positions_argument(PositionForm.VECTOR, 7, 2, 3, "cpu").tolist() == [7, 8, 9]
    ids = positions_argument(PositionForm.IDS, 7, 2, 3, "cpu")
    assert tuple(ids.shape) == (2, 3) and ids.dtype == torch.int64
    lengths = cu_seqlens((3, 1, 2), "cpu")
    assert lengths.tolist() == [0, 3, 4, 6] and lengths.dtype == torch.int32


class ForgetsThePresent(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, past_key_value=None, use_cache=False):
        return self.proj(x)  # no present, whatever use_cache says


def test_the_cache_session_says_when_a_protocol_is_not_kept():
    impl = Implementation("forgets", lambda c: ForgetsThePresent(c.d_model, c.num_heads),
                          Capabilities(causality=CausalForm("always"), cache=CacheForm(
                              style=CacheStyle.RETURNED, argument="past_key_value",
                              options=(("use_cache", True),))))
    instance = InProcessSubject(impl).instantiate(Config(1, 2, 2, 4, 2), 0)
    x = torch.randn(1, 2, 4)
    with pytest.raises(ImplementationError, match="returned no present cache"):
        instance.forward(Inputs(x, x, x, causal=True, cache=True))
    with pytest.raises(CapabilityError, match="the cache holds 0 tokens"):
        instance.forward(Inputs(x, x, x, causal=True, cache=True, position=3))


def test_a_modern_call_to_an_implementation_without_the_form_is_a_suite_error():
    from conformance.implementations.reference_sdpa import IMPLEMENTATION

    instance = InProcessSubject(IMPLEMENTATION).instantiate(Config(1, 2, 2, 4, 2), 0)
    x = torch.randn(1, 2, 4)
    for inputs, words in ((Inputs(x, x, x, cache=True), "declares no KV cache"),
                          (Inputs(x, x, x, position=2), "declares no position argument"),
                          (Inputs(x, x, x, segments=(1, 1)), "declares no packed sequences")):
        with pytest.raises(CapabilityError, match=words):
            instance.forward(inputs)


def test_declarations_of_the_modern_forms_read_and_refuse_in_one_line():
    declared = Declarations(window_arg="window_size:left", positions="pos:vector",
                            kv_cache="object@cache=mypkg.cache:KVCache",
                            packed="cu_seqlens_flat@cu")
    assert declared.window() == ("window_size", "left")
    assert declared.position_argument() == ("pos", PositionForm.VECTOR)
    assert declared.cache() == (CacheStyle.OBJECT, "cache", "mypkg.cache:KVCache")
    assert declared.packing() == (PackedForm.CU_SEQLENS_FLAT, "cu")
    assert Declarations(packed="mask").packing() == (PackedForm.MASK, None)
    for bad, call in ((Declarations(window_arg="w:both"), "window"),
                      (Declarations(kv_cache="object@cache"), "cache"),
                      (Declarations(packed="mask@m"), "packing"),
                      (Declarations(positions="p:matrix"), "position_argument")):
        with pytest.raises(DeclarationError) as raised:
            getattr(bad, call)()
        assert "\n" not in str(raised.value)


def test_the_modern_declarations_have_their_toml_spellings():
    from conformance.model.declaration_sources import from_mapping

    declared = from_mapping({"kv-heads-arg": "n_kv", "window-arg": "window_size:left",
                             "kv-cache": "returned@past", "packed": "mask",
                             "positions": "position_ids", "position-encoding": "rotary",
                             "alibi": "standard"}, "pyproject.toml")
    assert declared.kv_heads_arg == "n_kv" and declared.window() == ("window_size", "left")
    assert declared.cache() == (CacheStyle.RETURNED, "past", None)
    assert declared.declared_encoding() == "rotary" and declared.alibi == "standard"


class FixedGroups(nn.Module):
    """Grouped-query attention whose constructor fixes two key/value heads under a name inference
    doesn't know."""

    def __init__(self, d_model, num_heads, groups_of_kv=2):
        super().__init__()
        if num_heads % groups_of_kv:
            raise ValueError("num_heads must be a multiple of the key/value heads")
        self.inner = LlamaAttention(d_model, num_heads, groups_of_kv)
        self.inner.rope = None

    def forward(self, x):
        return self.inner(x)


def test_a_fixed_key_value_head_count_is_read_from_the_projections():
    inferred = infer(FixedGroups)
    assert inferred.implementation.capabilities.kv_heads == 2
    assert any(note.startswith("2 key/value head(s) at every head count (read from the "
                               "projections") for note in texts(inferred.notes))
    flagged = infer(FixedGroups, declared=Declarations(kv_heads_arg="groups_of_kv"))
    assert flagged.implementation.capabilities.kv_heads == "config"


def test_a_declared_cache_style_that_does_not_work_is_said_not_guessed():
    notes = texts(infer(LlamaAttention, declared=Declarations(kv_cache="buffers@past_key_value")).notes)
    assert any("a prefill through the cache as buffers it keeps" in note and
               "the KV cache is not checked" in note for note in notes)
    with pytest.raises(InferenceError, match="kv-cache"):
        infer(LlamaAttention, declared=Declarations(kv_cache="buffers"))


def test_the_decode_bench_times_cached_steps_beside_sdpa():
    points = decode_bench([MODERN["modern-llama"], MODERN["modern-varlen"]], contexts=(8,),
                          rounds=3)
    measured, skipped = points
    assert measured.median_ms > 0 and measured.ratio_to_sdpa > 0
    assert skipped.skipped == "declares no KV cache"
    table = decode_table(points, "heading")
    assert "| `modern-llama` |" in table and "modern-varlen at 8: declares no KV cache" in table


def test_a_case_with_grouped_heads_and_a_window_says_so():
    case = Case(batch=1, q_len=4, kv_len=4, num_heads=4, head_dim=2, kv_heads=2, window=2,
                causal=True)
    assert "kv_heads=2" in repr(case) and "window=2" in repr(case)
    assert (case.config.num_kv_heads, case.config.kv_heads, case.config.window) == (2, 2, 2)
