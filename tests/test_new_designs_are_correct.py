"""The new designs are correct, proved without the suite: each correct class in
``tests/fixtures/new_designs.py`` against attention computed here in float64 from its own
parameters with textbook formulas (temperatures, chunks, windows and relative positions one
index at a time, RMSNorm spelled out, head mixing as explicit sums, softmax with -inf masking and
the sink as one more term of the denominator). Every broken twin differs from its correct class
on an input that shows its bug, and every class builds and runs in float32, float64, bfloat16
and float16 at small and odd widths.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from tests.fixtures import new_designs as designs
from tests.oracle import F64, heads, linear, merge, randn, rms, same_weights


def build(cls, *args, seed=0, **kwargs):
    """``cls(*args, **kwargs)`` in float64, eval mode, from a fixed seed; the RMSNorm weights (ones
    at construction) made random so that they matter."""
    torch.manual_seed(seed)
    module = cls(*args, **kwargs).double().eval()
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, designs.RMSNorm):
                sub.weight.add_(0.5 * torch.randn(sub.weight.shape, generator=generator, dtype=F64))
    return module


# -- textbook float64 pieces ---------------------------------------------------------------------

def grouped(t, num_heads):
    """(B, Hkv, L, d) -> (B, num_heads, L, d): query head h reads key/value head h // group."""
    group = num_heads // t.shape[1]
    return t[:, [h // group for h in range(num_heads)]]


def softmax_masked(scores, allowed):
    """softmax over the last dimension with -inf where not ``allowed``."""
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)


def allowed_by(rule, keep, length):
    """(B or 1, 1, L, L) bool: rule(i, j) for query i and key j, and the padding ``keep``."""
    allowed = torch.tensor([[rule(i, j) for j in range(length)] for i in range(length)])
    allowed = allowed[None, None]
    return allowed if keep is None else allowed & keep[:, None, None, :]


def causal_rule(i, j):
    return j <= i


def kept(batch, length, counts):
    """(B, L) bool, element b keeping its first counts[b] tokens (right padding)."""
    keep = torch.zeros(batch, length, dtype=torch.bool)
    for b, count in enumerate(counts):
        keep[b, :count] = True
    return keep


def masks(length, empty_rows=False):
    """No mask and right padding, which leaves every query a key to read; with ``empty_rows``
    also left padding (the first token of element 1 padded), whose first query reads nothing in
    a causal layer."""
    cases = [None, kept(2, length, (length, max(1, length - 2)))]
    if empty_rows:
        left = torch.ones(2, length, dtype=torch.bool)
        left[1, 0] = False
        cases.append(left)
    return cases


def later_token_changes(module, d_model, length=6, at=3, seed=20):
    """The largest change of the outputs before ``at`` when token ``at`` changes."""
    x = randn(1, length, d_model, seed=seed)
    changed = x.clone()
    changed[:, at] += 1.0
    return (module(changed)[:, :at] - module(x)[:, :at]).abs().max()


LENGTHS = (1, 4, 9)


# -- 1. chunked attention with temperature tuning ------------------------------------------------

def chunked_oracle(m, x, keep):
    length = x.shape[1]
    chunk = m.attention_chunk_size
    temperature = torch.tensor([math.log(math.floor((i + 1) / m.floor_scale) + 1) * m.attn_scale + 1
                                for i in range(length)], dtype=F64)
    q = heads(linear(x, m.q_proj), m.num_heads) * temperature[:, None]
    k = grouped(heads(linear(x, m.k_proj), m.num_kv_heads), m.num_heads)
    v = grouped(heads(linear(x, m.v_proj), m.num_kv_heads), m.num_heads)
    allowed = allowed_by(lambda i, j: j <= i and i // chunk == j // chunk, keep, length)
    probs = softmax_masked(q @ k.transpose(-1, -2) / math.sqrt(m.head_dim), allowed)
    probs = torch.where(allowed.any(dim=-1, keepdim=True), probs, 0.0)  # an empty row reads nothing
    return linear(merge(probs @ v), m.o_proj)


@pytest.mark.parametrize(("d_model", "num_heads", "config", "kv_heads"), [
    (12, 4, {}, 2), (12, 3, {}, 1), (6, 2, {"attention_chunk_size": 3, "floor_scale": 2}, 1),
    (8, 1, {"num_kv_heads": 1, "attn_scale": 0.5}, 1),
])
def test_chunked_attention_is_causal_within_chunks_with_tempered_queries(d_model, num_heads, config,
                                                                         kv_heads):
    module = build(designs.ChunkedTemperatureAttention, d_model, num_heads, **config)
    assert module.num_kv_heads == kv_heads
    for length in (*LENGTHS, 13):
        x = randn(2, length, d_model, seed=length)
        for keep in masks(length, empty_rows=True):
            torch.testing.assert_close(module(x, mask=keep), chunked_oracle(module, x, keep))


def test_chunked_attention_gives_zero_to_a_row_that_sees_nothing():
    module = build(designs.ChunkedTemperatureAttention, 12, 4)
    x = randn(2, 8, 12, seed=21)
    keep = kept(2, 8, (8, 4))  # element 1: the whole second chunk (4..7) is padding
    keep[0, 0] = False  # element 0: the first query's only key is padded
    out = module(x, mask=keep)
    assert torch.isfinite(out).all()
    assert (out[1, 4:] == 0).all() and (out[0, 0] == 0).all()
    assert (out[1, :4] != 0).all() and (out[0, 1:] != 0).all()
    torch.testing.assert_close(out, chunked_oracle(module, x, keep))
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        typed = copy.deepcopy(module).to(dtype)(x.to(dtype), mask=keep)
        assert torch.isfinite(typed).all() and (typed[1, 4:] == 0).all()


def test_chunk_boundary_twin_cuts_the_chunks_one_early():
    module = build(designs.ChunkedTemperatureAttention, 12, 4)
    twin = same_weights(module, designs.ChunkBoundaryOffByOne, 12, 4)
    x = randn(1, 8, 12, seed=22)
    right, wrong = module(x), twin(x)
    torch.testing.assert_close(wrong[:, :3], right[:, :3])  # 0..2 share a chunk either way
    assert (wrong[:, 3] - right[:, 3]).abs().max() > 1e-3


def test_temperature_on_keys_twin_weights_the_keys_by_their_positions():
    module = build(designs.ChunkedTemperatureAttention, 12, 4, attention_chunk_size=8)
    twin = same_weights(module, designs.TemperatureOnKeys, 12, 4, attention_chunk_size=8)
    x = randn(1, 8, 12, seed=23)
    torch.testing.assert_close(twin(x[:, :3]), module(x[:, :3]))  # every temperature is 1 there
    assert (twin(x) - module(x)).abs().max() > 1e-3


# -- 2. Granite's attention multiplier -----------------------------------------------------------

def setting_oracle(m, x, keep):
    q = heads(linear(x, m.q_proj), m.num_heads)
    k = grouped(heads(linear(x, m.k_proj), m.num_kv_heads), m.num_heads)
    v = grouped(heads(linear(x, m.v_proj), m.num_kv_heads), m.num_heads)
    probs = softmax_masked(q @ k.transpose(-1, -2) * m.attention_multiplier,
                           allowed_by(causal_rule, keep, x.shape[1]))
    return linear(merge(probs @ v), m.o_proj)


@pytest.mark.parametrize(("config", "multiplier"), [({}, 1 / 4), ({"attention_multiplier": 0.3}, 0.3),
                                                    ({"num_kv_heads": 4}, 1 / 4)])
def test_granite_scales_by_its_multiplier(config, multiplier):
    module = build(designs.SettingScaledAttention, 16, 4, **config)
    assert module.attention_multiplier == pytest.approx(multiplier)
    for length in LENGTHS:
        x = randn(2, length, 16, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), setting_oracle(module, x, keep))


def test_multiplier_ignored_twin_scales_by_one_over_root_head_dim():
    module = build(designs.SettingScaledAttention, 16, 4)
    twin = same_weights(module, designs.MultiplierIgnored, 16, 4)
    assert twin.attention_multiplier == module.attention_multiplier == 0.25
    x = randn(2, 9, 16, seed=24)
    assert (twin(x) - module(x)).abs().max() > 1e-3


# -- 3. a learned per-head logit scale -----------------------------------------------------------

def learned_oracle(m, x, keep):
    q, k, v = (heads(t, m.num_heads) for t in linear(x, m.qkv).chunk(3, dim=-1))
    scale = torch.exp(m.logit_scale)[:, None, None]
    probs = softmax_masked(q @ k.transpose(-1, -2) * scale, allowed_by(causal_rule, keep, x.shape[1]))
    return linear(merge(probs @ v), m.proj)


@pytest.mark.parametrize(("d_model", "num_heads"), [(12, 3), (8, 4), (3, 3)])
def test_learned_temperature_is_a_scale_per_head(d_model, num_heads):
    module = build(designs.LearnedTemperatureAttention, d_model, num_heads)
    scales = module.logit_scale.exp()
    standard = 1 / math.sqrt(d_model // num_heads)
    assert ((scales / standard - 1.5).abs() < 0.3).all()
    assert (scales - standard).abs().min() > 0.1 * standard
    if num_heads > 1:
        assert scales.std() > 0
    for length in LENGTHS:
        x = randn(2, length, d_model, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), learned_oracle(module, x, keep))


# -- 4. OLMo-2's query/key norm over all heads ---------------------------------------------------

def qk_norm_oracle(m, x, keep):
    q = heads(rms(linear(x, m.q_proj), m.q_norm.weight, 1e-6), m.num_heads)
    k = grouped(heads(rms(linear(x, m.k_proj), m.k_norm.weight, 1e-6), m.num_kv_heads), m.num_heads)
    v = grouped(heads(linear(x, m.v_proj), m.num_kv_heads), m.num_heads)
    probs = softmax_masked(q @ k.transpose(-1, -2) / math.sqrt(m.head_dim),
                           allowed_by(causal_rule, keep, x.shape[1]))
    return linear(merge(probs @ v), m.o_proj)


@pytest.mark.parametrize(("d_model", "num_heads", "kv_heads"), [(16, 4, 2), (12, 3, 1), (6, 2, 1), (4, 1, 1)])
def test_qk_norm_normalises_all_heads_together_before_the_split(d_model, num_heads, kv_heads):
    module = build(designs.CrossHeadQKNormAttention, d_model, num_heads)
    assert module.num_kv_heads == kv_heads
    assert module.q_norm.weight.shape == (d_model,)
    assert module.k_norm.weight.shape == (kv_heads * d_model // num_heads,)
    for length in LENGTHS:
        x = randn(2, length, d_model, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), qk_norm_oracle(module, x, keep))


def test_qk_norm_over_sequence_twin_reads_later_tokens():
    module = build(designs.CrossHeadQKNormAttention, 16, 4)
    twin = same_weights(module, designs.QKNormOverSequence, 16, 4)
    assert later_token_changes(module, 16) < 1e-12
    assert later_token_changes(twin, 16) > 1e-3


# -- 5. talking heads ----------------------------------------------------------------------------

def talking_heads_oracle(m, x, keep):
    count = m.num_heads
    q, k, v = (heads(linear(x, layer), count) for layer in (m.to_q, m.to_k, m.to_v))
    logits = q @ k.transpose(-1, -2) / math.sqrt(m.head_dim)
    pre, post = m.pre_softmax_proj, m.post_softmax_proj
    mixed = torch.stack([sum(logits[:, h] * pre[h, g] for h in range(count)) for g in range(count)], dim=1)
    if keep is not None:
        mixed = mixed.masked_fill(~keep[:, None, None, :], float("-inf"))
    probs = torch.softmax(mixed, dim=-1)
    weights = torch.stack([sum(probs[:, h] * post[h, g] for h in range(count)) for g in range(count)],
                          dim=1)
    return linear(merge(weights @ v), m.to_out)


@pytest.mark.parametrize(("d_model", "num_heads"), [(12, 3), (8, 4), (4, 1)])
def test_talking_heads_mix_logits_before_and_weights_after_the_softmax(d_model, num_heads):
    module = build(designs.TalkingHeadsAttention, d_model, num_heads)
    eye = torch.eye(num_heads, dtype=F64)
    for matrix in (module.pre_softmax_proj, module.post_softmax_proj):
        assert (matrix - eye).abs().max() > 0.01
    for length in LENGTHS:
        x = randn(2, length, d_model, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), talking_heads_oracle(module, x, keep))


# -- 6. differential attention, causal -----------------------------------------------------------

def differential_oracle(m, x, keep):
    d = m.head_dim
    q, k, v = (linear(x, layer) for layer in (m.q_proj, m.k_proj, m.v_proj))
    lam = torch.exp(m.lambda_q1 @ m.lambda_k1) - torch.exp(m.lambda_q2 @ m.lambda_k2) + m.lambda_init
    allowed = allowed_by(causal_rule, keep, x.shape[1])[:, 0]
    outs = []
    for h in range(m.num_heads):
        maps = []
        for half in (0, 1):
            cols = slice((2 * h + half) * d, (2 * h + half + 1) * d)
            maps.append(softmax_masked(q[..., cols] @ k[..., cols].transpose(-1, -2) / math.sqrt(d), allowed))
        out = (maps[0] - lam * maps[1]) @ v[..., 2 * h * d:2 * (h + 1) * d]
        outs.append(rms(out, m.subln.weight, 1e-5) * (1 - m.lambda_init))
    return linear(torch.cat(outs, dim=-1), m.out_proj)


@pytest.mark.parametrize(("d_model", "num_heads", "config", "width"),
                         [(16, 2, {}, 4), (12, 2, {"depth": 4}, 3), (6, 2, {}, 1), (3, 3, {}, 1)])
def test_differential_causal_attention_masks_both_maps(d_model, num_heads, config, width):
    module = build(designs.DifferentialCausalAttention, d_model, num_heads, **config)
    assert module.head_dim == width
    depth = config.get("depth", 1)
    assert module.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.3 * (depth - 1)))
    for length in LENGTHS:
        x = randn(2, length, d_model, seed=length)
        for keep in masks(length):
            torch.testing.assert_close(module(x, mask=keep), differential_oracle(module, x, keep))


def test_differential_twin_reads_the_future_through_its_second_map():
    module = build(designs.DifferentialCausalAttention, 16, 2)
    twin = same_weights(module, designs.DifferentialSecondMapUnmasked, 16, 2)
    assert later_token_changes(module, 16) < 1e-12
    assert later_token_changes(twin, 16) > 1e-3


# -- 7. Swin window attention --------------------------------------------------------------------

def swin_regions(size, window, shift):
    """The region (0, 1, 2) of each row (or column) of a map of ``size`` after Swin's shift."""
    return [0 if y < size - window else 1 if y < size - shift else 2 for y in range(size)]


def expected_shift_mask(height, width, window, shift):
    """(nW, N, N): 0 where two tokens of a window share a region of the shifted map, else -100."""
    rows, cols = swin_regions(height, window, shift), swin_regions(width, window, shift)
    out = []
    for wy in range(height // window):
        for wx in range(width // window):
            tokens = [(wy * window + a, wx * window + b) for a in range(window) for b in range(window)]
            region = [3 * rows[y] + cols[x] for y, x in tokens]
            out.append([[0.0 if region[i] == region[j] else -100.0 for j in range(len(tokens))]
                        for i in range(len(tokens))])
    return torch.tensor(out)


def test_the_shift_mask_is_swins():
    mask = designs.shift_window_mask(8, 8, 4, 2)
    assert mask.shape == (4, 16, 16)
    torch.testing.assert_close(mask, expected_shift_mask(8, 8, 4, 2))
    assert (mask[0] == 0).all() and (mask[3] != 0).any()  # the top-left window is one region
    torch.testing.assert_close(designs.shift_window_mask(4, 6, 2, 1), expected_shift_mask(4, 6, 2, 1))
    torch.testing.assert_close(designs.shift_window_mask(4, 6, (2, 2), (1, 1)),
                               designs.shift_window_mask(4, 6, 2, 1))


def swin_oracle(m, x, mask):
    wh, ww = m.window_size
    n = wh * ww
    tokens = [(a, b) for a in range(wh) for b in range(ww)]
    index = torch.tensor([[(yi - yj + wh - 1) * (2 * ww - 1) + (xi - xj + ww - 1) for yj, xj in tokens]
                          for yi, xi in tokens])
    bias = m.relative_position_bias_table[index].permute(2, 0, 1)  # (H, N, N)
    q, k, v = (heads(t, m.num_heads) for t in linear(x, m.qkv).chunk(3, dim=-1))
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    allowed = torch.ones(x.shape[0], 1, n, n, dtype=torch.bool)
    if mask is not None:
        assert set(mask.unique().tolist()) <= {0.0, -100.0}
        allowed = torch.stack([mask[b % mask.shape[0]] == 0 for b in range(x.shape[0])])[:, None]
    return linear(merge(softmax_masked(scores, allowed) @ v), m.proj)


@pytest.mark.parametrize(("dim", "num_heads", "window"), [(8, 2, (4, 4)), (6, 3, (2, 3)), (3, 1, (3, 2))])
def test_window_attention_is_swins(dim, num_heads, window):
    module = build(designs.WindowAttention, dim, window, num_heads)
    table = module.relative_position_bias_table
    assert table.shape == ((2 * window[0] - 1) * (2 * window[1] - 1), num_heads)
    assert table.abs().max() > 0.1
    n = window[0] * window[1]
    x = randn(6, n, dim, seed=25)
    torch.testing.assert_close(module(x), swin_oracle(module, x, None))


def test_window_attention_with_the_shifted_window_mask():
    module = build(designs.WindowAttention, 8, (4, 4), 2)
    mask = designs.shift_window_mask(8, 8, 4, 2)
    image = randn(2, 8, 8, 8, seed=26)  # (B, H, W, C)
    shifted = torch.roll(image, shifts=(-2, -2), dims=(1, 2))
    windows = designs.window_partition(shifted, 4).reshape(-1, 16, 8)  # (nW * B, N, C)
    assert windows.shape == (8, 16, 8)
    torch.testing.assert_close(windows[5].reshape(4, 4, 8), shifted[1, :4, 4:])  # image 1, window 1
    out = module(windows, mask=mask)
    torch.testing.assert_close(out, swin_oracle(module, windows, mask))
    torch.testing.assert_close(module(windows), swin_oracle(module, windows, None))
    assert (out - module(windows)).abs().max() > 1e-3


def test_window_bias_after_softmax_twin():
    module = build(designs.WindowAttention, 8, (4, 4), 2)
    twin = same_weights(module, designs.WindowBiasAfterSoftmax, 8, (4, 4), 2)
    windows = randn(8, 16, 8, seed=27)
    assert (twin(windows) - module(windows)).abs().max() > 1e-3
    mask = designs.shift_window_mask(8, 8, 4, 2)
    assert (twin(windows, mask=mask) - module(windows, mask=mask)).abs().max() > 1e-3


# -- 8. attention sinks --------------------------------------------------------------------------

def sink_oracle(m, x, keep):
    length = x.shape[1]
    window = m.sliding_window or length
    q = heads(linear(x, m.q_proj), m.num_heads)
    k = grouped(heads(linear(x, m.k_proj), m.num_kv_heads), m.num_heads)
    v = grouped(heads(linear(x, m.v_proj), m.num_kv_heads), m.num_heads)
    scores = q @ k.transpose(-1, -2) / math.sqrt(m.head_dim)
    allowed = allowed_by(lambda i, j: i - window < j <= i, keep, length)
    numerators = torch.exp(scores).masked_fill(~allowed, 0.0)
    denominators = numerators.sum(dim=-1, keepdim=True) + torch.exp(m.sinks)[:, None, None]
    return linear(merge(numerators / denominators @ v), m.o_proj)


@pytest.mark.parametrize(("d_model", "num_heads", "config"), [
    (16, 4, {}), (16, 4, {"sliding_window": 3}), (12, 3, {"sliding_window": 1}), (6, 2, {"num_kv_heads": 2}),
])
def test_sink_attention_leaves_the_sink_its_share(d_model, num_heads, config):
    module = build(designs.SinkAttention, d_model, num_heads, **config)
    assert module.sinks.shape == (num_heads,) and module.sinks.abs().max() > 0.1
    for length in LENGTHS:
        x = randn(2, length, d_model, seed=length)
        for keep in masks(length, empty_rows=True):
            torch.testing.assert_close(module(x, mask=keep), sink_oracle(module, x, keep))


def test_sink_attention_rows_sum_to_less_than_one_and_empty_rows_read_nothing():
    module = build(designs.SinkAttention, 8, 2, sliding_window=2)
    with torch.no_grad():
        module.v_proj.weight.zero_()
        module.v_proj.bias.fill_(1.0)  # every value is ones: the output shows each row's sum
        module.o_proj.weight.copy_(torch.eye(8, dtype=F64))
        module.o_proj.bias.zero_()
    x = randn(1, 5, 8, seed=28)
    keep = torch.tensor([[False, True, True, True, True]])
    sums = module(x, mask=keep)
    assert (sums[0, 0] == 0).all()  # a row that sees no key gives all its weight to the sink
    assert ((sums[0, 1:] > 0) & (sums[0, 1:] < 1)).all()


# -- every class: builds, runs in every dtype ----------------------------------------------------

SIZES = ((8, 2), (6, 2), (3, 3), (16, 4))
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def instance(cls, d_model, num_heads):
    if issubclass(cls, designs.WindowAttention):
        return cls(d_model, (2, 2), num_heads)
    return cls(d_model, num_heads)


def inputs(module, d_model, length):
    """(x, call keywords) for a run without padding."""
    if isinstance(module, designs.WindowAttention):
        mask = designs.shift_window_mask(4, 4, 2, 1)  # nW = 4 windows of N = 4 tokens
        return randn(8, 4, d_model, seed=length), [{}, {"mask": mask}]
    return randn(2, length, d_model, seed=length), [{}, {"mask": torch.ones(2, length, dtype=torch.bool)}]


@pytest.mark.parametrize("cls", [*designs.CORRECT, *designs.BROKEN], ids=lambda cls: cls.__name__)
def test_every_class_builds_and_runs_at_every_size_and_dtype(cls):
    for d_model, num_heads in SIZES:
        torch.manual_seed(0)
        module = instance(cls, d_model, num_heads).eval()
        for dtype in DTYPES:
            typed = copy.deepcopy(module).to(dtype)
            for length in (1, 5):
                x, calls = inputs(module, d_model, length)
                for keywords in calls:
                    out = typed(x.to(dtype), **keywords)
                    assert out.shape == x.shape and out.dtype == dtype
                    assert torch.isfinite(out).all(), (cls.__name__, d_model, num_heads, dtype)


def test_the_collection_says_what_each_twin_breaks():
    assert designs.STYLES is designs.CORRECT
    checks = {"padding", "fully_masked", "row_stochastic", "head_split", "causal", "reference",
              "scale", "permutation", "position_shift", "autograd", "kv_cache", "packed",
              "low_precision", "chunked"}
    for cls in designs.CORRECT:
        assert cls.__doc__ and "forward(" in cls.__doc__ and "BROKEN" not in cls.__doc__
    for cls, check in designs.BROKEN.items():
        assert check in checks
        assert cls.__doc__.startswith("BROKEN twin:") and f"Caught by: {check}." in cls.__doc__
        assert any(issubclass(cls, correct) for correct in designs.CORRECT)
