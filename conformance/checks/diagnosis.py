"""Recognise known bugs: when an output disagrees with the reference, does it match a known
mistake computed from the same weights? One sentence naming the likely bug, or None."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch

from conformance.checks.mask_mistakes import named, output_mistake
from conformance.model.bugs import Bug
from conformance.model.forms import PositionEncoding, Rotary
from conformance.model.results import Hint
from conformance.model.weights import HeadWeights
from conformance.numerics.position_encoding import encode
from conformance.numerics.reference import allowed_keys, attention_output, reference_attention
from conformance.numerics.tolerance import abs_error, only_rows
from conformance.subject.boundary import Inputs

MATCH = 1e-3
"""Relative closeness that counts as "matches this mistake": far looser than the correctness
tolerance (the mistake is computed in float64, the implementation is not), far tighter than the
distance between two different mistakes."""


AMBIGUOUS = "which at this size is each of"
"""How a hint says that mistakes equal at this size can't be told apart (no single kind)."""


SOFTMAX_OVER_QUERIES = Hint("the weights sum to 1 over the queries (each key's column), not over "
                            "the keys (each query's row): softmax over the wrong dimension?",
                            Bug.SOFTMAX_OVER_QUERIES.value)
"""The likely bug where a softmax normalises over the query axis (``dim=-2``), whichever check
finds it: the reference's diagnosis reproduces it, ``row_stochastic`` measures its columns."""


def _scales(head_dim: int, num_heads: int) -> list[tuple[Bug, str, float]]:
    """Recognisable scales other than 1/sqrt(head_dim): (kind, the likely bug in words, value)."""
    d_model = head_dim * num_heads
    candidates = [
        (Bug.SCALE_D_MODEL, f"1/sqrt(d_model) = 1/sqrt({d_model}): did you divide by "
         "sqrt(hidden_dim) instead of sqrt(head_dim)?", 1 / math.sqrt(d_model)),
        (Bug.SCALE_MISSING, "1 (no scaling): is the 1/sqrt(head_dim) factor missing?", 1.0),
        (Bug.SCALE_TWICE, f"1/head_dim = 1/{head_dim}: is 1/sqrt(head_dim) applied twice?",
         1 / head_dim),
        (Bug.SCALE_NUM_HEADS, f"1/sqrt(num_heads) = 1/sqrt({num_heads}): divided by the head "
         "count?", 1 / math.sqrt(num_heads)),
        (Bug.SCALE_INVERTED, f"sqrt(head_dim) = sqrt({head_dim}): multiplied instead of "
         "divided?", math.sqrt(head_dim)),
    ]
    correct = 1 / math.sqrt(head_dim)
    # A candidate equal to the correct scale (head_dim 1, one head) names no bug.
    return [(kind, words, s) for kind, words, s in candidates if not math.isclose(s, correct)]


def scale_candidates(head_dim: int, num_heads: int) -> dict[str, float]:
    """Recognisable scales other than 1/sqrt(head_dim), each with the likely bug in words."""
    return {words: s for _, words, s in _scales(head_dim, num_heads)}


def scale_groups(head_dim: int, num_heads: int) -> list[tuple[Hint, float]]:
    """The recognisable scales, those equal at this size in words together (the output can't
    tell them apart: no single kind), the first named last."""
    groups: list[tuple[list[tuple[Bug, str]], float]] = []
    for kind, words, value in _scales(head_dim, num_heads):
        same = next((g for g in groups if math.isclose(g[1], value)), None)
        if same is None:
            groups.append(([(kind, words)], value))
        else:
            same[0].insert(0, (kind, words))
    return [(Hint(named[0][1], named[0][0].value) if len(named) == 1 else
             Hint(f"{value:.3g}, {AMBIGUOUS}: "
                  + "; or ".join(words for _, words in named)), value)
            for named, value in groups]


def _misshaped(weights: HeadWeights, inputs: Inputs, *, causal: bool, split_transposed: bool,
               merge_transposed: bool, window: int | None = None, chunk: int | None = None,
               encoding: PositionEncoding | None = None,
               batch_first: bool = True) -> torch.Tensor:
    """float64 attention with a head split or merge done by reshape alone (no transpose); with
    ``batch_first`` False, heads split with reshape(H, B, L, Dh).transpose(0, 1), which mixes
    the batch and head dimensions."""
    w = weights.expanded().map(lambda t: t.to(torch.float64).cpu())
    heads, head_dim = w.num_heads, w.head_dim

    def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        flat = x.to(torch.float64).cpu() @ weight.reshape(-1, weight.shape[-1]).T + bias.reshape(-1)
        batch, length, _ = flat.shape
        if not batch_first:
            return flat.reshape(heads, batch, length, -1).transpose(0, 1)
        if split_transposed:
            return flat.view(batch, length, heads, -1).transpose(1, 2)
        return flat.reshape(batch, heads, length, -1)

    q = project(inputs.query, w.w_q, w.b_q)
    k = project(inputs.key, w.w_k, w.b_k)
    v = project(inputs.value, w.w_v, w.b_v)
    keep = None if inputs.keep is None else inputs.keep.cpu()
    q, k, bias = encode(q, k, encoding, keep, inputs.position,
                        heads=(0, weights.num_heads, weights.num_kv_heads))
    logits = (q / math.sqrt(head_dim)) @ k.transpose(-1, -2)
    if bias is not None:
        logits = logits + bias
    allowed = allowed_keys(q.shape[0], q.shape[2], k.shape[2],
                           None if inputs.keep is None else inputs.keep.cpu(), causal,
                           window=window, chunk=chunk)
    attention = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
    out = attention @ v
    batch, _, length, _ = out.shape
    merged = (out.transpose(1, 2).reshape(batch, length, -1) if merge_transposed
              else out.reshape(batch, length, -1))
    return merged if w.w_o is None else merged @ w.w_o.T + w.b_o


BATCH_HEADS_MIXED = ("matches heads split with reshape(H, B, L, Dh) (then transpose(0, 1)) "
                     "instead of view(B, L, H, Dh).transpose(1, 2): the batch and head "
                     "dimensions are mixed")


def batch_heads_mixed(weights: HeadWeights, inputs: Inputs, *, causal: bool,
                      window: int | None = None, chunk: int | None = None,
                      encoding: PositionEncoding | None = None) -> torch.Tensor:
    """float64 attention with the heads split by reshape(H, B, L, Dh), mixing batch and heads."""
    return _misshaped(weights, inputs, causal=causal, split_transposed=True,
                      merge_transposed=True, window=window, chunk=chunk, encoding=encoding,
                      batch_first=False)


def reproduces(output: torch.Tensor, variant: torch.Tensor, correct: torch.Tensor,
               rows: torch.Tensor | None) -> bool:
    """Whether ``output`` reproduces a known mistake's float64 ``variant`` (within MATCH) on a
    case where the mistake and the ``correct`` computation differ (see :func:`_told_apart`)."""
    return _matches(output, variant, rows) and not _matches(correct, variant, rows)


def repeat_words(weights: HeadWeights) -> str:
    return (f"matches key/value heads expanded with repeat instead of repeat_interleave: query "
            f"head h reads key/value head h mod {weights.num_kv_heads}, not h // {weights.group}")


def form_hint(output: torch.Tensor, weights: HeadWeights, inputs: Inputs, *, causal: bool,
              rows: torch.Tensor | None = None, window: int | None = None, chunk: int | None = None,
              encoding: PositionEncoding | None = None) -> str | None:
    """The likely bug in a modern form (grouped key/value heads paired by repeat, a window one key
    off, RoPE's frequencies or pairing) when ``output`` matches it, and it differs from the
    correct computation on this case: for checks whose own hint is about something else."""
    correct = reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                  keep=inputs.keep, causal=causal, window=window, chunk=chunk,
                                  encoding=encoding, start=inputs.position).output
    return _told_apart(output, correct, _form_variants(weights, inputs, causal=causal,
                                                       window=window, chunk=chunk, encoding=encoding), rows)


def _told_apart(output: torch.Tensor, correct: torch.Tensor,
                variants: list[tuple[str, Callable[[], torch.Tensor]]],
                rows: torch.Tensor | None) -> str | None:
    """The words of the first variant ``output`` reproduces that this case tells apart from
    the correct computation: where a bug computes what the correct code computes (a head split
    without transpose at one head, repeat and repeat_interleave with one key/value head), the
    case is no evidence of it, and naming it would be a guess."""
    for words, compute in variants:
        if reproduces(output, compute(), correct, rows):
            return words
    return None


def _form_variants(weights: HeadWeights, inputs: Inputs, *, causal: bool, window: int | None,
                   encoding: PositionEncoding | None = None, chunk: int | None = None
                   ) -> list[tuple[str, Callable[[], torch.Tensor]]]:
    def ref(w: HeadWeights = weights, width: int | None = window,
            used: PositionEncoding | None = encoding) -> torch.Tensor:
        return reference_attention(w, inputs.query, inputs.key, inputs.value, keep=inputs.keep,
                                   causal=causal, window=width, chunk=chunk, encoding=used,
                                   start=inputs.position).output

    variants: list[tuple[str, Callable[[], torch.Tensor]]] = []
    if weights.group > 1:
        variants.append((repeat_words(weights), lambda: ref(tiled_groups(weights))))
    if causal and window is not None:
        variants.append((f"matches a window of {window + 1} keys instead of the declared "
                         f"{window}: is the window one key too wide (i - j <= W)?",
                         lambda: ref(width=window + 1)))
        if window > 1:
            variants.append((f"matches a window of {window - 1} keys instead of the declared "
                             f"{window}: is the window one key too narrow?",
                             lambda: ref(width=window - 1)))
    if encoding is not None and encoding.rotary is not None:
        variants += [(words, lambda other=other: ref(used=replace(encoding, rotary=other)))
                     for words, other in rotary_mistakes(encoding.rotary, weights)]
    return variants


def rotary_mistakes(rotary: Rotary, weights: HeadWeights) -> list[tuple[str, Rotary]]:
    """RoPE done another recognisable way than ``rotary`` promises, each with the likely bug."""
    head_dim, d_model = weights.head_dim, weights.head_dim * weights.num_heads
    dims = rotary.rotated_dims(head_dim)
    other_pairing = "interleaved" if rotary.pairing == "half" else "half"
    mistakes = [(f"matches RoPE on {other_pairing} pairs instead of {rotary.pairing} ones: are "
                 "the rotated dimensions paired the other way (rotate_half vs (2i, 2i + 1))?",
                 replace(rotary, pairing=other_pairing))]
    if dims and d_model != head_dim:
        # theta^(-2i / d_model) = (theta^(r / d_model))^(-2i / r)
        mistakes.append((f"matches RoPE frequencies computed over d_model = {d_model} instead "
                         f"of the rotated head dimensions ({dims}): theta^(-2i/d_model)?",
                         replace(rotary, theta=rotary.theta ** (dims / d_model))))
    for theta in (10000.0, 500000.0, 1000000.0, 100.0, math.sqrt(rotary.theta)):
        if not math.isclose(theta, rotary.theta):
            mistakes.append((f"matches RoPE with theta {theta:g} instead of {rotary.theta:g}: "
                             "is the base (theta) or its exponent wrong?",
                             replace(rotary, theta=theta)))
    for fraction in (1.0, 0.5, 0.25):
        other = replace(rotary, fraction=fraction, dims=None)
        if other.rotated_dims(head_dim) != dims:
            mistakes.append((f"matches RoPE rotating {other.rotated_dims(head_dim)} of "
                             f"{head_dim} dimensions per head instead of {dims}: is the rotary "
                             "fraction (partial_rotary_factor, rotary_pct) applied as meant?",
                             other))
    return mistakes


def tiled_groups(weights: HeadWeights) -> HeadWeights:
    """Grouped weights rearranged so that the reference's ``repeat_interleave`` expansion gives
    what ``repeat`` (tiling) gives: query head h reading key/value head h mod Hkv."""
    expanded_by_repeat = {name: getattr(weights, name).repeat(
        weights.group, *([1] * (getattr(weights, name).dim() - 1)))
        for name in ("w_k", "b_k", "w_v", "b_v")}
    return replace(weights, **expanded_by_repeat)


def _softmax_over_queries(weights: HeadWeights, inputs: Inputs, causal: bool,
                          window: int | None, encoding: PositionEncoding | None,
                          chunk: int | None = None) -> torch.Tensor:
    """The output of attention whose softmax runs down each key's column (over the queries)
    instead of along each row: the reference's own scores and values, normalised the wrong
    way (a row with no allowed key keeps weight 0)."""
    result = reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                 keep=inputs.keep, causal=causal, window=window, chunk=chunk,
                                 encoding=encoding, start=inputs.position)
    empty = torch.isinf(result.scores).all(dim=-1, keepdim=True)
    attention = torch.softmax(result.scores.masked_fill(empty, 0.0), dim=-2).masked_fill(empty,
                                                                                          0.0)
    return attention_output(attention, result.values, weights)


def _matches(output: torch.Tensor, variant: torch.Tensor, rows: torch.Tensor | None) -> bool:
    scale = max(1.0, float(variant.abs().max()))
    return float(only_rows(abs_error(output, variant), rows).max()) <= MATCH * scale


def explain(output: torch.Tensor, weights: HeadWeights, inputs: Inputs, *, causal: bool,
            rows: torch.Tensor | None = None, window: int | None = None, chunk: int | None = None,
            encoding: PositionEncoding | None = None) -> str | None:
    """The likely bug behind ``output``, when it matches a known mistake (a mask mistake: see
    :mod:`conformance.checks.mask_mistakes`)."""
    def ref(w: HeadWeights = weights, **options) -> torch.Tensor:
        return reference_attention(w, inputs.query, inputs.key, inputs.value, keep=inputs.keep,
                                   causal=causal, window=window, chunk=chunk, encoding=encoding,
                                   start=inputs.position, **options).output

    variants: list[tuple[str, Callable[[], torch.Tensor]]] = [
        (Hint(f"matches the reference at scale {words}", words.kind), lambda s=s: ref(scale=s))
        for words, s in scale_groups(weights.head_dim, weights.num_heads)
    ]
    variants.append((SOFTMAX_OVER_QUERIES,
                     lambda: _softmax_over_queries(weights, inputs, causal, window, encoding,
                                                           chunk=chunk)))
    if weights.w_o is not None:
        variants.append((Hint("matches the reference without its output projection: is W_o "
                              "skipped?", Bug.OUTPUT_PROJECTION_SKIPPED.value),
                         lambda: ref(replace(weights, w_o=None, b_o=None))))
    if weights.w_v.shape == weights.w_k.shape:
        variants.append((Hint("matches the reference with the key projection used for the "
                              "values: is k_proj applied to v?",
                              Bug.KEY_PROJECTION_FOR_VALUES.value),
                         lambda: ref(replace(weights, w_v=weights.w_k, b_v=weights.b_k))))
    variants.append((Hint("matches heads split with view(B, H, L, Dh) and no transpose",
                          Bug.SPLIT_WITHOUT_TRANSPOSE.value),
                     lambda: _misshaped(weights, inputs, causal=causal, split_transposed=False,
                                        merge_transposed=True, window=window, chunk=chunk,
                                        encoding=encoding)))
    variants.append((Hint("matches heads merged with reshape(B, L, H * Dh) and no transpose "
                          "back", Bug.MERGE_WITHOUT_TRANSPOSE.value),
                     lambda: _misshaped(weights, inputs, causal=causal, split_transposed=True,
                                        merge_transposed=False, window=window, chunk=chunk,
                                        encoding=encoding)))
    variants.append((BATCH_HEADS_MIXED, lambda: batch_heads_mixed(weights, inputs, causal=causal,
                                                                  window=window, chunk=chunk,
                                                                  encoding=encoding)))
    variants += _form_variants(weights, inputs, causal=causal, window=window, chunk=chunk, encoding=encoding)
    words = _told_apart(output, ref(), variants, rows)
    if words is not None:
        return words
    return named(output_mistake(output, weights, inputs, causal=causal, rows=rows,
                                window=window, chunk=chunk, encoding=encoding))
