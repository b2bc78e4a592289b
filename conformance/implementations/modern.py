"""Correct modern attention forms, hand-written and on SDPA: grouped-query heads, rotary position
embeddings, ALiBi, sliding windows, KV caches in the three styles in use, packed sequences.

- ``LlamaAttention(d_model, num_heads, num_kv_heads=None)``: hand-written, step by step (so a
  mutant can break one step): grouped-query heads expanded with ``repeat_interleave``, RoPE on
  half-split pairs (HuggingFace's ``rotate_half``) at ``position_ids``, a causal mask aligned
  bottom-right, an ``attention_mask`` of 1 = keep ((B, Lk) or (B, Lq, Lk)), and HuggingFace's
  legacy cache: ``past_key_value=(k, v)`` in, ``(output, (k, v))`` out with ``use_cache=True``.
- ``MistralAttention``: the same with a ``sliding_window`` of W keys (row t sees t - W + 1 .. t).
- ``SlidingWindowAttention``: a sliding window without position encoding (every check of the
  float64 reference applies), taking (B, Lq, Lk) masks, so packed sequences can go through a
  block-diagonal mask.
- ``AlibiAttention``: ALiBi with the paper's slopes, and a cache object passed in
  (``cache=KVCache()``, updated in place).
- ``MetaLlamaAttention(dim, n_heads, n_kv_heads=None, max_batch_size=8, max_seq_len=64)``:
  Meta Llama's layout on ``F.scaled_dot_product_attention`` (``enable_gqa``): RoPE on interleaved
  pairs, preallocated cache buffers written at ``start_pos``.
- ``VarlenAttention``: packed variable-length sequences as FlashAttention's varlen functions
  take them (flat (total, D) tokens, ``cu_seqlens``), on SDPA with a block-diagonal causal mask.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from conformance import Implementation, PackedForm, Packing
from conformance.implementations.modern_declared import (
    KEEP_INT_PER_QUERY,
    ROPE_THETA_ARGUMENT,
    declare_alibi,
    declare_buffered,
    declare_llama,
    declare_varlen,
)


def alibi_slopes(num_heads: int) -> list[float]:
    """The ALiBi paper's slopes: 2^(-8 (h + 1) / H) for H a power of two; otherwise those of the
    nearest smaller power of two, then every other slope of the next larger one."""
    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def rotary_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """(..., L, head_dim / 2) float64 angles p * theta^(-2i / head_dim)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    return positions.to(torch.float64)[..., None] * inv_freq.to(positions.device)


def rotate_half_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """RoPE pairing dimension i with i + head_dim / 2 (HuggingFace's ``rotate_half``)."""
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def rotate_interleaved_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """RoPE pairing dimensions 2i and 2i + 1 (Meta Llama's complex ``freqs_cis``)."""
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class KVCache:
    """A cache object a caller creates and passes to every decoding call: ``update`` appends the
    new keys and values along the sequence axis and returns everything cached so far."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=2)
            self.values = torch.cat([self.values, values], dim=2)
        return self.keys, self.values


class ModernAttention(nn.Module):
    """Causal self-attention written step by step; the classes below choose its options."""

    rope: str | None = "half"
    alibi = False

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None) -> None:
        super().__init__()
        num_kv_heads = num_kv_heads or num_heads
        if d_model % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"d_model {d_model}, {num_heads} heads and {num_kv_heads} key/value "
                             "heads don't divide")
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = d_model // num_heads
        if self.rope and self.head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
        if self.rope:
            self.rope_theta = 10000.0
        self.window: int | None = None
        self.q_proj = nn.Linear(d_model, num_heads * self.head_dim)
        self.k_proj = nn.Linear(d_model, num_kv_heads * self.head_dim)
        self.v_proj = nn.Linear(d_model, num_kv_heads * self.head_dim)
        self.o_proj = nn.Linear(num_heads * self.head_dim, d_model)
        if self.alibi:
            self.register_buffer("slopes", torch.tensor(self.head_slopes(num_heads)),
                                 persistent=False)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                past_key_value: tuple[torch.Tensor, torch.Tensor] | None = None,
                use_cache: bool = False):
        past_length = 0 if past_key_value is None else past_key_value[0].shape[2]
        extend = None if past_key_value is None else (
            lambda k, v: self.extend_cache(past_key_value, k, v))
        output, present = self.attention(x, attention_mask, position_ids, past_length, extend,
                                         causal=self.causal_with_cache(use_cache))
        return (output, self.present(past_key_value, present)) if use_cache else output

    # The steps, each overridable by a mutant.

    def head_slopes(self, num_heads: int) -> list[float]:
        """ALiBi's slope of each head."""
        return alibi_slopes(num_heads)

    def causal_with_cache(self, use_cache: bool) -> bool:
        """Whether the causal mask applies: always, prefill with a cache included."""
        return True

    def extend_cache(self, past, k, v):
        """Past keys and values (B, Hkv, P, Dh) followed by the new ones, along the sequence."""
        return torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)

    def present(self, past, present):
        """The cache to hand back: every key and value attended to."""
        return present

    def default_positions(self, past_length: int, length: int, batch: int,
                          device: torch.device) -> torch.Tensor:
        """The new tokens' positions: right after everything cached."""
        positions = torch.arange(past_length, past_length + length, device=device)
        return positions[None, :].expand(batch, length)

    def split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        """(B, L, heads * Dh) -> (B, heads, L, Dh)."""
        return x.view(x.shape[0], x.shape[1], heads, self.head_dim).transpose(1, 2)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        """RoPE on half-split pairs at ``positions`` (B, L)."""
        if self.rope is None:
            return q, k
        angles = rotary_angles(positions, self.head_dim, self.rope_theta)[:, None]
        return rotate_half_pairs(q, angles), rotate_half_pairs(k, angles)

    def expand_kv(self, x: torch.Tensor) -> torch.Tensor:
        """(B, Hkv, L, Dh) -> (B, H, L, Dh): query head h reads key/value head h // G."""
        return x.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)

    def allowed(self, q_len: int, kv_len: int, device: torch.device,
                causal: bool) -> torch.Tensor:
        """(Lq, Lk) bool: query row i is position kv_len - q_len + i (bottom-right aligned) and
        sees the keys up to it, within the window."""
        rows = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        cols = torch.arange(kv_len, device=device)[None, :]
        allowed = cols <= rows if causal else torch.ones(q_len, kv_len, dtype=torch.bool,
                                                         device=device)
        if self.window is not None:
            allowed = allowed & (rows - cols < self.window)
        return allowed

    def position_bias(self, q_len: int, kv_len: int, device: torch.device,
                      dtype: torch.dtype) -> torch.Tensor | float:
        """ALiBi's -m_h (i - j), (H, Lq, Lk); 0 without ALiBi."""
        if not self.alibi:
            return 0.0
        rows = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        cols = torch.arange(kv_len, device=device)[None, :]
        return -self.slopes.to(dtype)[:, None, None] * (rows - cols).to(dtype)

    def attention(self, x, attention_mask, position_ids, past_length: int, extend, *,
                  causal: bool):
        """(output, (keys, values) attended to); ``extend`` prepends the cached keys/values."""
        batch, length, _ = x.shape
        q = self.split_heads(self.q_proj(x), self.num_heads)
        k = self.split_heads(self.k_proj(x), self.num_kv_heads)
        v = self.split_heads(self.v_proj(x), self.num_kv_heads)
        if position_ids is None:
            position_ids = self.default_positions(past_length, length, batch, x.device)
        q, k = self.rotate(q, k, position_ids)
        if extend is not None:
            k, v = extend(k, v)
        keys, values = self.expand_kv(k), self.expand_kv(v)
        scores = (q / math.sqrt(self.head_dim)) @ keys.transpose(-2, -1)
        scores = scores + self.position_bias(length, keys.shape[2], x.device, scores.dtype)
        allowed = self.allowed(length, keys.shape[2], x.device, causal)[None, None]
        if attention_mask is not None:
            keep = attention_mask != 0
            allowed = allowed & (keep[:, None, None, :] if keep.dim() == 2 else keep[:, None])
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        out = (weights @ values).transpose(1, 2).reshape(batch, length, -1)
        return self.o_proj(out), (k, v)


class LlamaAttention(ModernAttention):
    """Grouped-query heads, RoPE (half-split pairs) with base ``rope_theta``, HuggingFace's
    legacy tuple cache."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 rope_theta: float = 10000.0) -> None:
        super().__init__(d_model, num_heads, num_kv_heads)
        self.rope_theta = rope_theta


class MistralAttention(ModernAttention):
    """LlamaAttention with a sliding window of ``sliding_window`` keys."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 sliding_window: int = 4) -> None:
        super().__init__(d_model, num_heads, num_kv_heads)
        self.window = sliding_window


class SlidingWindowAttention(ModernAttention):
    """A sliding window of ``sliding_window`` keys, grouped-query heads, no position encoding;
    ``attention_mask`` (B, Lk) or (B, Lq, Lk), 1 = keep."""

    rope = None

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None,
                 sliding_window: int = 4) -> None:
        super().__init__(d_model, num_heads, num_kv_heads)
        self.window = sliding_window

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                past_key_value: tuple[torch.Tensor, torch.Tensor] | None = None,
                use_cache: bool = False):
        return super().forward(x, attention_mask, None, past_key_value, use_cache)


class AlibiAttention(ModernAttention):
    """ALiBi (the paper's slopes) instead of RoPE; a ``KVCache`` object passed in as ``cache``
    and updated in place."""

    rope = None
    alibi = True

    def __init__(self, d_model: int, num_heads: int) -> None:
        super().__init__(d_model, num_heads)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        past_length = 0 if cache is None or cache.keys is None else cache.keys.shape[2]
        extend = None if cache is None else cache.update
        output, _ = self.attention(x, attention_mask, None, past_length, extend, causal=True)
        return output


class MetaLlamaAttention(nn.Module):
    """Meta Llama's ``Attention`` on SDPA: wq/wk/wv/wo without bias, grouped-query heads handed
    to SDPA (``enable_gqa=True``), RoPE on interleaved pairs, and preallocated cache buffers
    (max_batch_size x max_seq_len) written at ``start_pos``. Without ``start_pos`` no cache is
    used (a plain causal forward, which trains)."""

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int | None = None,
                 max_batch_size: int = 8, max_seq_len: int = 64,
                 rope_theta: float = 10000.0) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads or n_heads
        if dim % n_heads or n_heads % self.n_kv_heads:
            raise ValueError(f"dim {dim}, {n_heads} heads and {self.n_kv_heads} key/value heads "
                             "don't divide")
        self.head_dim = dim // n_heads
        if self.head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head_dim, got {self.head_dim}")
        self.rope_theta = rope_theta
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        shape = (max_batch_size, max_seq_len, self.n_kv_heads, self.head_dim)
        self.register_buffer("cache_k", torch.zeros(shape), persistent=False)
        self.register_buffer("cache_v", torch.zeros(shape), persistent=False)

    def forward(self, x: torch.Tensor, start_pos: int | None = None) -> torch.Tensor:
        bsz, seqlen, _ = x.shape
        offset = start_pos or 0
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        positions = torch.arange(offset, offset + seqlen, device=x.device)
        angles = rotary_angles(positions, self.head_dim, self.rope_theta)[:, None]
        xq, xk = rotate_interleaved_pairs(xq, angles), rotate_interleaved_pairs(xk, angles)
        if start_pos is not None:
            self.cache_k[:bsz, start_pos : start_pos + seqlen] = xk.detach()
            self.cache_v[:bsz, start_pos : start_pos + seqlen] = xv.detach()
            xk = torch.cat([self.cache_k[:bsz, :start_pos], xk], dim=1)
            xv = torch.cat([self.cache_v[:bsz, :start_pos], xv], dim=1)
        q, k, v = (t.transpose(1, 2) for t in (xq, xk, xv))
        output = self.attend(q, k, v)
        return self.wo(output.transpose(1, 2).reshape(bsz, seqlen, -1))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """SDPA with the causal mask aligned bottom-right: the new tokens are the last ones."""
        q_len, kv_len = q.shape[2], k.shape[2]
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril(kv_len - q_len)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class VarlenAttention(nn.Module):
    """Causal self-attention over packed variable-length sequences, FlashAttention's varlen way:
    ``forward(x, cu_seqlens, max_seqlen)`` with x (total, D) and cu_seqlens (n + 1,) int32; a
    batch (B, L, D) without cu_seqlens. Grouped-query heads; SDPA with a block-diagonal causal
    mask built from each token's sequence index."""

    def __init__(self, d_model: int, num_heads: int, num_kv_heads: int | None = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads or num_heads
        if d_model % num_heads or num_heads % self.num_kv_heads:
            raise ValueError(f"d_model {d_model}, {num_heads} heads and {self.num_kv_heads} "
                             "key/value heads don't divide")
        self.head_dim = d_model // num_heads
        self.qkv = nn.Linear(d_model, (num_heads + 2 * self.num_kv_heads) * self.head_dim)
        self.out = nn.Linear(num_heads * self.head_dim, d_model)

    def sequence_index(self, cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
        """(total,) the sequence each token belongs to."""
        return torch.searchsorted(cu_seqlens[1:].to(torch.int64),
                                  torch.arange(total, device=cu_seqlens.device), right=True)

    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None) -> torch.Tensor:
        packed = cu_seqlens is not None
        if packed:
            x = x[None]
        batch, length, _ = x.shape
        sizes = (self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                 self.num_kv_heads * self.head_dim)
        q, k, v = self.qkv(x).split(sizes, dim=-1)
        q = q.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
        if packed:
            index = self.sequence_index(cu_seqlens, length)
            mask = mask & (index[:, None] == index[None, :])
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        out = self.out(out.transpose(1, 2).reshape(batch, length, -1))
        return out[0] if packed else out


# --- Declarations -------------------------------------------------------------------------------

IMPLEMENTATIONS: list[Implementation] = [
    declare_llama("modern-llama", LlamaAttention, configured=ROPE_THETA_ARGUMENT,
                  description="correct: grouped-query heads, RoPE, legacy tuple KV cache "
                              "(hand-written)"),
    declare_llama("modern-mistral", MistralAttention, window="config",
                  description="correct: LlamaAttention with a sliding window"),
    declare_llama("modern-sliding-window", SlidingWindowAttention, window="config",
                  position={"positional": None, "relative": None, "argument": None, "form": None},
                  mask=KEEP_INT_PER_QUERY, packing=Packing(form=PackedForm.MASK),
                  description="correct: sliding window, grouped-query heads, no position "
                              "encoding (every reference check applies); packed through a "
                              "block-diagonal mask"),
    declare_alibi("modern-alibi", AlibiAttention, benchmark=True,
                  description="correct: ALiBi with the paper's slopes, a KV cache object "
                              "passed in (hand-written)"),
    declare_buffered("modern-llama-sdpa", MetaLlamaAttention, benchmark=True,
                     description="correct: Meta Llama layout on SDPA (enable_gqa), interleaved "
                                 "RoPE, preallocated cache buffers at start_pos"),
    declare_varlen("modern-varlen", VarlenAttention, benchmark=True,
                   description="correct: packed sequences with cu_seqlens (flat tokens), "
                               "grouped-query heads, fused q/k/v, SDPA"),
]
"""The correct modern implementations (the mutants in ``conformance/implementations/mutants`` break one
step of one of them)."""
