"""Issue 25's causes, each on a module of our own (``tests/fixtures/real_layer_causes.py``).

First the proof, without the suite: every correct class against a float64 attention written here
from its own weights (its RoPE, its key/value groups, its cache decoding against its full
forward, its packed sequences against each alone). Then what the suite makes of each, with
nothing declared: no false failure, the state said, and every broken twin caught by the check
that owns its bug.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from conformance import Status
from conformance.loading.registry import resolve
from conformance.model.remedies import texts
from conformance.run.many import check_many
from tests.fixtures import real_layer_causes as causes

X = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def attention(q, k, v, allowed=None):
    """softmax(q k^T / sqrt(d), masked to ``allowed``) v over (B, H, L, Dh)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def heads(t, count):
    return t.view(*t.shape[:2], count, -1).transpose(1, 2)


def merge(out, linear):
    return linear(out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1))


def rope(x, theta=10000.0, rotated=None, sign=1.0):
    """Half-split RoPE at positions 0..L-1 on the first ``rotated`` dims, computed in float64."""
    dim = x.shape[-1]
    r = dim if rotated is None else rotated
    positions = torch.arange(x.shape[2], dtype=torch.float64)
    angles = sign * positions[:, None] * theta ** (-torch.arange(0, r, 2).double() / r)
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., : r // 2], x[..., r // 2: r]
    return torch.cat((a * cos - b * sin, b * cos + a * sin, x[..., r:]), dim=-1)


CAUSAL = torch.ones(9, 9, dtype=torch.bool).tril()


# -- the proof ---------------------------------------------------------------------------------

def test_scratch_llama_is_grouped_causal_rope_attention_with_a_token_mask():
    module = causes.ScratchLlamaAttention(16, 4, n_kv_heads=2).double()
    q = rope(heads(module.q_proj(X), 4))
    k = rope(heads(module.k_proj(X), 2)).repeat_interleave(2, dim=1)
    v = heads(module.v_proj(X), 2).repeat_interleave(2, dim=1)
    token = torch.ones(2, 9, dtype=torch.bool)
    token[1, 6:] = False  # True = a real token
    allowed = CAUSAL & token[:, None, None, :]
    expected = merge(attention(q, k, v, allowed), module.o_proj)
    rows = token  # padded queries' rows are unspecified
    got = module(X, padding_mask=token)
    # float32 RoPE tables: float64 runs agree to float32's rounding, not float64's
    torch.testing.assert_close(got[rows], expected[rows], rtol=1e-6, atol=1e-6)
    assert (got[rows] - expected[rows]).abs().max() > 1e-12


def test_group_normalised_attention_is_plain_grouped_attention_where_it_builds():
    module = causes.GroupNormalisedAttention(16, 4, num_kv_heads=2).double()
    q = heads(module.q(X), 4)
    k, v = (heads(layer(X), 2).repeat_interleave(2, dim=1) for layer in (module.k, module.v))
    torch.testing.assert_close(module(X), merge(attention(q, k, v), module.out))
    with pytest.raises(ZeroDivisionError):
        causes.GroupNormalisedAttention(8, 4, num_kv_heads=1)  # head_dim 2, groups of 4


def test_static_cache_decoding_through_input_pos_equals_the_full_forward():
    module = causes.StaticCacheAttention(16, 4, n_local_heads=2).double()
    q = rope(heads(module.wq(X), 4))
    k = rope(heads(module.wk(X), 2)).repeat_interleave(2, dim=1)
    v = heads(module.wv(X), 2).repeat_interleave(2, dim=1)
    expected = merge(attention(q, k, v, CAUSAL), module.wo)
    torch.testing.assert_close(module(X), expected)
    fresh = causes.StaticCacheAttention(16, 4, n_local_heads=2).double()
    fresh.load_state_dict(module.state_dict())
    fresh(torch.randn(2, 9, 16, dtype=torch.float64))  # the buffers hold other tokens
    steps = [fresh(X[:, :3], input_pos=torch.arange(3))]
    steps += [fresh(X[:, t:t + 1], input_pos=torch.tensor([t])) for t in range(3, 9)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected)


def test_the_twin_that_never_writes_a_decode_step_breaks_at_the_second_step():
    module = causes.StaticCacheDecodeNeverWrites(16, 4).double()
    full = module(X)
    module(torch.randn(2, 9, 16, dtype=torch.float64))
    steps = [module(X[:, :3], input_pos=torch.arange(3))]
    steps += [module(X[:, t:t + 1], input_pos=torch.tensor([t])) for t in range(3, 9)]
    torch.testing.assert_close(steps[1], full[:, 3:4])  # the first step is right
    assert (steps[2] - full[:, 4:5]).abs().max() > 1e-3  # the next reads an unwritten slot


@pytest.mark.parametrize(("theta", "factor"), [(10000.0, 1.0), (500000.0, 0.5)])
def test_configured_rope_turns_with_its_theta_and_share(theta, factor):
    module = causes.ConfiguredRopeAttention(16, 2, rope_theta=theta,
                                            partial_rotary_factor=factor).double()
    q, k, v = (heads(t, 2) for t in module.qkv(X).split(16, dim=-1))
    rotated = int(8 * factor)
    q, k = rope(q, theta, rotated), rope(k, theta, rotated)
    torch.testing.assert_close(module(X), merge(attention(q, k, v), module.dense))


def test_the_broken_and_reversed_rope_twins():
    ignored = causes.RopeThetaIgnored(16, 2, rope_theta=500000.0).double()
    q, k, v = (heads(t, 2) for t in ignored.qkv(X).split(16, dim=-1))
    torch.testing.assert_close(ignored(X), merge(attention(rope(q), rope(k), v), ignored.dense))
    reversed_ = causes.ReversedRopeAttention(16, 2).double()
    q, k, v = (heads(t, 2) for t in reversed_.qkv(X).split(16, dim=-1))
    expected = merge(attention(rope(q, sign=-1.0), rope(k, sign=-1.0), v), reversed_.dense)
    torch.testing.assert_close(reversed_(X), expected)


def test_the_trial_filled_layers_are_what_their_docstrings_say():
    groups = causes.GroupsEncoderAttention(16, 4, groups=2).double()
    q = heads(groups.q(X), 4)
    k, v = (heads(t, 2).repeat_interleave(2, dim=1) for t in groups.kv(X).chunk(2, dim=-1))
    torch.testing.assert_close(groups(X), merge(attention(q, k, v), groups.o))
    context = causes.RequiredContextAttention(16, 4, ctx=9).double()
    q, k, v = (heads(t, 4) for t in context.c_attn(X).split(16, dim=2))
    torch.testing.assert_close(context(X), merge(attention(q, k, v, CAUSAL), context.c_proj))
    with pytest.raises(RuntimeError):
        context(torch.randn(1, 10, 16, dtype=torch.float64))


def test_the_packed_encoder_equals_each_sequence_alone():
    module = causes.PackedVarlenEncoder(16, 4).double()
    tokens = X[0]
    bounds = (0, 3, 5, 9)
    cu_seqlens = torch.tensor(bounds, dtype=torch.int32)
    packed = module(tokens, cu_seqlens, 4)
    for start, end in itertools.pairwise(bounds):
        x = tokens[None, start:end]
        q, k, v = (heads(t, 4) for t in module.Wqkv(x).split(16, dim=-1))
        torch.testing.assert_close(packed[start:end],
                                   merge(attention(q, k, v), module.out_proj)[0])


# -- what the suite makes of them, nothing declared ------------------------------------------------

CORRECT = ("ScratchLlamaAttention", "GroupNormalisedAttention", "StaticCacheAttention",
           "ConfiguredRopeAttention", "ReversedRopeAttention", "GroupsEncoderAttention",
           "RequiredContextAttention", "PackedVarlenEncoder")
BROKEN = ("StaticCacheDecodeNeverWrites", "RopeThetaIgnored", "GroupsEncoderFirstGroupOnly",
          "PackedVarlenEncoderLeaks")


@pytest.fixture(scope="module")
def checked():
    """{class name: (inferred notes, {check: result})}, every class checked in this process."""
    targets = [(f"tests.fixtures.real_layer_causes:{name}",
                resolve(f"tests.fixtures.real_layer_causes:{name}")[0])
               for name in (*CORRECT, *BROKEN)]
    results = check_many(targets, devices=["cpu"], jobs=2)
    found = {}
    for spec, impl in targets:
        name = spec.rpartition(":")[2]
        found[name] = (" ".join(texts(impl.notes)), {r.check: r for r in results
                                              if r.implementation == impl.name})
    return found


@pytest.mark.parametrize("name", CORRECT)
def test_no_correct_layer_fails(checked, name):
    _, results = checked[name]
    assert [(c, r.reason) for c, r in results.items() if r.status is Status.FAILED] == []


def test_cause_1_a_name_never_decides_a_failure(checked):
    notes, results = checked["ScratchLlamaAttention"]
    assert "padding_mask: bool mask, True = attend" in notes
    padding = results["padding"]
    assert padding.status is Status.WARNED
    assert "the opposite of what a mask named 'padding_mask' strongly means" in padding.reason
    assert "torchtune" in padding.reason
    assert padding.remedy.options[0].value == "keep_bool:key_padding@padding_mask"


def test_cause_2_a_position_argument_that_writes_a_cache_is_checked_as_one(checked):
    notes, results = checked["StaticCacheAttention"]
    assert "input_pos: not a position input alone but a KV cache API" in notes
    assert results["kv_cache"].status is Status.PASSED
    assert results["position_shift"].status is Status.SKIPPED


def test_cause_2_a_layer_whose_plain_calls_keep_state_is_said_uncheckable():
    from conformance.loading.registry import ResolveError

    with pytest.raises(ResolveError, match=r"keeps state between calls: the same call gave "
                                           r"outputs .* apart before and after a call"):
        resolve("tests.fixtures.real_layer_causes:AppendingCacheAttention")


def test_cause_3_every_check_judges_at_the_precision_the_layer_has(checked):
    _, results = checked["ScratchLlamaAttention"]
    gate = " ".join(results["gate"].observations)
    assert "float64 runs agree with the float64 reference to" in gate
    assert "judged with float32 tolerances" in gate
    for check in ("reference", "head_split", "stability", "fully_masked", "position_shift"):
        assert results[check].status in (Status.PASSED, Status.WARNED), check


def test_cause_4_a_configuration_refused_inside_a_check_is_a_limit(checked):
    _, results = checked["GroupNormalisedAttention"]
    said = [o for r in results.values() for o in r.observations if o.startswith("refuses ")]
    assert said and "ZeroDivisionError" in said[0]
    assert results["kv_groups"].status is Status.PASSED


def test_cause_4_a_replayed_case_at_a_refused_configuration_is_no_failure():
    spec = "tests.fixtures.real_layer_causes:GroupNormalisedAttention"
    case = "Case(batch=2, q_len=3, kv_len=3, num_heads=4, head_dim=2, dtype='float32', seed=0, " \
           "kv_heads=1)"
    from conformance.generation.cases import Case

    (result,) = check_many([(spec, resolve(spec)[0])], devices=["cpu"], checks=["contract"],
                           replay=Case.parse(case))
    assert result.status is Status.PASSED
    assert any(o.startswith("refuses 1 configuration") for o in result.observations)


def test_cause_5_unknown_required_arguments_are_filled_by_trial(checked):
    notes, results = checked["GroupsEncoderAttention"]
    assert "groups: key/value heads (filled by trial" in notes
    assert results["kv_groups"].status is Status.PASSED
    notes, _ = checked["RequiredContextAttention"]
    assert "ctx: context length (filled by trial" in notes


def test_cause_5_a_broken_twin_of_a_trial_filled_layer_fails_for_its_bug(checked):
    notes, results = checked["GroupsEncoderFirstGroupOnly"]
    assert "groups: key/value heads (filled by trial" in notes
    failed = {c for c, r in results.items() if r.status is Status.FAILED}
    assert {"kv_groups", "reference", "head_split"} <= failed
    assert "gate" not in failed


def test_cause_6_a_packed_form_is_found_by_behaviour(checked):
    notes, results = checked["PackedVarlenEncoder"]
    assert "packed self-attention forward(hidden_states (total, D), cu_seqlens, max_seqlen)" in notes
    assert results["packed"].status is Status.PASSED
    assert results["reference"].status is Status.PASSED
    notes, results = checked["PackedVarlenEncoderLeaks"]
    assert "packed self-attention forward" in notes
    failed = {c for c, r in results.items() if r.status is Status.FAILED}
    assert {"packed", "batch_independence"} <= failed and "gate" not in failed


def test_cause_7_an_ignored_configuration_fails(checked):
    _, results = checked["ConfiguredRopeAttention"]
    assert results["configuration"].status is Status.PASSED
    _, results = checked["RopeThetaIgnored"]
    assert results["configuration"].status is Status.FAILED
    assert "the configured value is ignored" in results["configuration"].reason
    assert [c for c, r in results.items() if r.status is Status.FAILED] == ["configuration"]


def test_cause_8_a_reversed_rope_is_a_warning_with_evidence(checked):
    notes, results = checked["ReversedRopeAttention"]
    assert "turned by -p * theta^(-2i/r) (reversed)" in notes
    assert results["reference"].status is Status.WARNED
    assert "the other way round from every published RoPE" in results["reference"].reason


def test_cause_9_a_decode_step_that_never_writes_is_caught(checked):
    _, results = checked["StaticCacheDecodeNeverWrites"]
    assert results["kv_cache"].status is Status.FAILED
    assert "no call of this decoding wrote" in results["kv_cache"].hint
    assert [c for c, r in results.items() if r.status is Status.FAILED] == ["kv_cache"]
