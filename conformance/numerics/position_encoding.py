"""Relative position encodings as the float64 reference computes them: RoPE and ALiBi.

RoPE rotates each head's query and key vectors by angles proportional to the token's position:
of a head's ``Dh`` dimensions, the first ``r`` (all of them, or a fraction) are split into
``r / 2`` pairs, pair ``i`` rotated by ``p * omega_i`` with ``omega_i = theta^(-2i / r)``. The
pairs are ``(i, i + r / 2)`` (``half``: HuggingFace's ``rotate_half``, GPT-NeoX) or
``(2i, 2i + 1)`` (``interleaved``: Meta Llama's complex ``freqs_cis``, GPT-J, torchtune). Then
``q_i . k_j`` depends on the positions through ``i - j`` alone.

ALiBi adds ``-m_h (i - j)`` to head ``h``'s logit of query ``i`` and key ``j`` (``-m_h |i - j|``
where it is symmetric); BLOOM counts positions over the kept tokens only (``cumsum(mask) - 1``),
so padding in the middle of a sequence does not count as distance.
"""

from __future__ import annotations

import math

import torch

from conformance.model.forms import AlibiBias, PositionEncoding, Rotary


def standard_slopes(num_heads: int) -> list[float]:
    """The ALiBi paper's slopes (its reference ``get_slopes``): 2^(-8 (h + 1) / H) for H a power
    of two; otherwise those of the nearest smaller power of two, then every other slope of the
    next larger one."""
    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + standard_slopes(2 * closest)[0::2][: num_heads - closest]


def head_slopes(alibi: AlibiBias, num_heads: int, kv_heads: int) -> list[float]:
    """The slope of each canonical head: the paper's, in the module's own head order where its
    grouped query heads are read relabelled (``alibi.tiled``)."""
    slopes = standard_slopes(num_heads)
    if alibi.tiled and 0 < kv_heads < num_heads:
        group = num_heads // kv_heads
        slopes = [slopes[(c % group) * kv_heads + c // group] for c in range(num_heads)]
    return slopes


def token_positions(batch: int, length: int, start: int = 0, keep: torch.Tensor | None = None,
                    counts_kept: bool = False) -> torch.Tensor:
    """(B, L) float64 positions: ``start .. start + L - 1``, or with ``counts_kept`` the number of
    kept tokens before each one (``keep`` (B, L) bool; a masked token gets its predecessor's)."""
    if counts_kept and keep is not None:
        counted = keep.cpu().to(torch.float64).cumsum(dim=-1) - 1
        return counted.clamp_min(0) + start
    positions = torch.arange(start, start + length, dtype=torch.float64)
    return positions.expand(batch, length)


def exact_integers(dtype: torch.dtype) -> int:
    """The largest n such that every integer up to n is exact in ``dtype`` (256 in bfloat16,
    2048 in float16)."""
    return int(2 / torch.finfo(dtype).eps)


def rotate(x: torch.Tensor, rotary: Rotary, positions: torch.Tensor,
           tables_in_dtype: bool = False) -> torch.Tensor:
    """``x`` (B, H, L, Dh) with its first rotated dimensions turned by RoPE at ``positions``
    (B, L), computed in x's dtype from float64 angles (or, ``tables_in_dtype``, from angles
    and cos/sin computed in x's dtype: another rounding path a correct module takes)."""
    head_dim = x.shape[-1]
    dims = rotary.rotated_dims(head_dim)
    if dims == 0:
        return x
    angles = positions.to(torch.float64)[:, None, :, None] * rotary.frequencies(head_dim)
    if tables_in_dtype:
        angles = (positions.to(x.dtype)[:, None, :, None]
                  * rotary.frequencies(head_dim).to(x.dtype)).to(x.device)
    if rotary.reversed:
        angles = -angles
    cos, sin = (f(angles).to(dtype=x.dtype, device=x.device) for f in (torch.cos, torch.sin))
    turned, kept = x[..., :dims], x[..., dims:]
    if rotary.pairing == "half":
        a, b = turned[..., : dims // 2], turned[..., dims // 2:]
        turned = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
    else:
        a, b = turned[..., 0::2], turned[..., 1::2]
        turned = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    return torch.cat([turned, kept], dim=-1)


def alibi_bias(alibi: AlibiBias, heads: tuple[int, int, int], q_positions: torch.Tensor,
               k_positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, H, Lq, Lk) logit bias ``-m_h (i - j)`` (or ``-m_h |i - j|``) at the given positions,
    for ``heads`` = (first, total, key/value heads): heads first .. of ``total``."""
    first, total, kv_heads = heads
    slopes = torch.tensor(head_slopes(alibi, total, kv_heads), dtype=torch.float64)[first:]
    distance = q_positions[:, None, :, None] - k_positions[:, None, None, :]
    if alibi.symmetric:
        distance = distance.abs()
    return (-slopes[None, :, None, None] * distance).to(dtype)


def encode(q: torch.Tensor, k: torch.Tensor, encoding: PositionEncoding | None,
           keep: torch.Tensor | None, start: int = 0, kv_start: int | None = None, *,
           heads: tuple[int, int, int] | None = None, tables_in_dtype: bool = False
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Apply ``encoding`` to per-head ``q`` (B, H, Lq, Dh) and ``k`` (B, Hk, Lk, Dh): rotated q
    and k, and the logit bias (B, H, Lq, Lk) or None. Queries sit at ``start ..``, keys at
    ``kv_start ..`` (``start`` by default); ``keep`` (B, Lk) is the key mask (for positions that
    count kept tokens); ``heads`` = (first, total, key/value heads) where q holds some of a
    module's heads (by default all of them, grouped as q and k are)."""
    if encoding is None:
        return q, k, None
    batch, q_len, kv_len = q.shape[0], q.shape[2], k.shape[2]
    kv_start = start if kv_start is None else kv_start
    bias = None
    if encoding.rotary is not None:
        q = rotate(q, encoding.rotary, token_positions(batch, q_len, start), tables_in_dtype)
        k = rotate(k, encoding.rotary, token_positions(batch, kv_len, kv_start), tables_in_dtype)
    if encoding.alibi is not None:
        counted = encoding.alibi.counts_kept and keep is not None
        k_positions = token_positions(batch, kv_len, kv_start, keep, counted)
        q_positions = (k_positions if counted and q_len == kv_len
                       else token_positions(batch, q_len, start))
        bias = alibi_bias(encoding.alibi, heads or (0, q.shape[1], q.shape[1]), q_positions,
                          k_positions, q.dtype)[:, : q.shape[1]]
        if encoding.alibi.scaled:  # added before the logits' scaling, scaled with them
            bias = bias / math.sqrt(q.shape[-1])
    return q, k, bias
