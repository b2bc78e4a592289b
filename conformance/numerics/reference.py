"""The float64 reference: multi-head attention computed from canonical per-head weights.

Policy for a query row with no key to attend to (every key masked, or masked by causality):
``"zeros"`` (the default) gives that row zero attention weights, so its attention output is 0 and
the layer output is ``b_o`` (what ``F.scaled_dot_product_attention`` does since PyTorch 2.5);
``"nan"`` gives NaN; ``"uniform"`` spreads the weight evenly over all keys (what a finite fill
value such as -1e9 gives).

Grouped-query weights (fewer key/value heads than query heads) are expanded with
``repeat_interleave`` along the head axis: query head h reads key/value head h // (H / Hkv). A
sliding window of W keys restricts causal row t to keys t - W + 1 .. t. A relative position
encoding (RoPE, ALiBi; see :mod:`conformance.numerics.position_encoding`) is applied with the queries at
positions ``start .. start + Lq - 1`` and the keys at ``start .. start + Lk - 1``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch

from conformance.model.forms import PositionEncoding
from conformance.model.weights import HeadWeights
from conformance.numerics.position_encoding import encode

FullyMaskedPolicy = Literal["zeros", "nan", "uniform"]


@dataclass(frozen=True)
class ReferenceResult:
    """``output`` (B, Lq, D_out), ``attention`` weights (B, H, Lq, Lk), each row's log-sum-exp
    of its (scaled, masked) logits ``lse`` (B, H, Lq), natural log, and what the weights were
    computed from and applied to: the ``scores`` (B, H, Lq, Lk; scaled, biased, -inf where a
    key is not allowed) and the per-head ``values`` (B, H, Lk, Dv)."""

    output: torch.Tensor
    attention: torch.Tensor
    scores: torch.Tensor
    values: torch.Tensor

    @functools.cached_property
    def lse(self) -> torch.Tensor:
        # Computed when asked (only the kernel check does): a tenth of every reference's time.
        return torch.logsumexp(self.scores, dim=-1)


def attention_output(attention: torch.Tensor, values: torch.Tensor,
                     weights: HeadWeights) -> torch.Tensor:
    """The layer's output (B, Lq, D_out) for attention weights (B, H, Lq, Lk) over per-head
    ``values`` (B, H, Lk, Dv): the heads concatenated, then ``weights``' output projection
    where it has one."""
    batch, _, q_len, _ = attention.shape
    concat = (attention @ values).transpose(1, 2).reshape(batch, q_len, -1)
    if weights.w_o is None:
        return concat
    return concat @ weights.w_o.to(concat).T + weights.b_o.to(concat)


def allowed_keys(batch: int, q_len: int, kv_len: int, keep: torch.Tensor | None, causal: bool,
                 device: torch.device | str = "cpu", *, window: int | None = None,
                 offset: int = 0, chunk: int | None = None) -> torch.Tensor:
    """(B, 1, Lq, Lk) bool: which key each query row may attend to (causal: row i sees keys
    j <= i + ``offset``, top-left aligned at 0, bottom-right at Lk - Lq; with a ``window`` of W
    keys, row t sees keys t - W + 1 .. t; in ``chunk``s of C positions, only the keys of its own
    chunk, j // C == (i + ``offset``) // C, as Llama 4's chunked attention)."""
    allowed = torch.ones(batch, 1, q_len, kv_len, dtype=torch.bool, device=device)
    if keep is not None:
        allowed = allowed & keep.to(device)[:, None, None, :]
    if causal:
        rows = torch.arange(q_len, device=device)[:, None]
        cols = torch.arange(kv_len, device=device)[None, :]
        allowed = allowed & (cols <= rows + offset)
        if window is not None:
            allowed = allowed & (rows - cols < window)
        if chunk is not None:
            allowed = allowed & ((rows + offset) // chunk == cols // chunk)
    return allowed


def reference_attention(
    weights: HeadWeights,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    keep: torch.Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    fully_masked: FullyMaskedPolicy = "zeros",
    dtype: torch.dtype = torch.float64,
    scale_first: bool = True,
    window: int | None = None,
    chunk: int | None = None,
    encoding: PositionEncoding | None = None,
    start: int = 0,
    heads: tuple[int, int, int] | None = None,
    tables_in_dtype: bool = False,
    allowed: torch.Tensor | None = None,
    softcap: float | None = None,
) -> ReferenceResult:
    """Multi-head attention, computed in ``dtype`` (float64 for the reference).

    ``query`` (B, Lq, D_in), ``key``/``value`` (B, Lk, D_in); ``keep`` (B, Lk) bool. ``scale``
    defaults to 1/sqrt(head_dim). Passing the case's own dtype gives the suite's plain same-dtype
    attention, the baseline that tolerances are measured against. ``scale_first=False`` scales the product
    instead of q (another rounding path; the same in exact arithmetic). ``window``: a causal
    sliding window of that many keys; ``chunk``: causal chunks of that many positions.
    ``encoding``: RoPE / ALiBi, tokens from position ``start`` on; ``heads`` = (first, total,
    key/value heads) when the weights are heads first .. of a module with ``total`` heads
    (ALiBi's slopes are per head).

    ``allowed`` (B, 1, Lq, Lk) bool replaces the keys ``keep``, ``causal`` and ``window`` allow
    (a kernel's own alignment or window; a mistaken mask, for diagnosis). ``softcap`` c caps
    the scaled logits to c tanh(s / c) before masking (Gemma 2's, FlashAttention's
    ``softcap``; by default the ``encoding``'s). A bug is simulated by the diagnosis from what
    the result holds (its scores and values), never here.
    """
    w = weights.expanded().map(lambda t: t.to(dtype))
    q_in, k_in, v_in = (t.to(dtype) for t in (query, key, value))
    # (B, L, D) x (H, Dh, D) -> (B, H, L, Dh)
    q = torch.einsum("bld,hed->bhle", q_in, w.w_q) + w.b_q[None, :, None, :]
    k = torch.einsum("bld,hed->bhle", k_in, w.w_k) + w.b_k[None, :, None, :]
    v = torch.einsum("bld,hed->bhle", v_in, w.w_v) + w.b_v[None, :, None, :]
    q, k, bias = encode(q, k, encoding, keep, start,
                        heads=heads or (0, weights.num_heads, weights.num_kv_heads),
                        tables_in_dtype=tables_in_dtype)
    normaliser = encoding.normaliser if encoding is not None else None
    if normaliser is not None and not normaliser.modelled:
        raise ValueError(f"the reference does not model {normaliser.describe()}")
    if scale is None and normaliser is not None:
        scale = normaliser.scale_at(weights.head_dim)  # its fitted slope: the layer's own
    if scale is None and encoding is not None and encoding.scale is not None:
        scale = encoding.scale.at(weights.head_dim)  # the layer's own, measured and explained
    scale = 1.0 / math.sqrt(weights.head_dim) if scale is None else scale
    # Scale q before the product, as SDPA does: in float16 the unscaled product can overflow.
    logits = (q * scale) @ k.transpose(-1, -2) if scale_first else (q @ k.transpose(-1, -2)) * scale
    if bias is not None:
        logits = logits + bias.to(logits.device)
    if softcap is None and encoding is not None:
        softcap = encoding.softcap
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)

    batch, q_len, kv_len = q_in.shape[0], q_in.shape[1], k_in.shape[1]
    if allowed is None:
        allowed = allowed_keys(batch, q_len, kv_len, keep, causal, q_in.device, window=window,
                               chunk=chunk)
    allowed = allowed.to(q_in.device)
    if normaliser is not None:  # an observed map other than softmax: empty rows weigh 0
        attention = normaliser.weights(logits, allowed, q, k)
        if fully_masked == "nan":
            attention = attention.masked_fill(~allowed.any(dim=-1, keepdim=True), float("nan"))
        return ReferenceResult(output=attention_output(attention, v, w), attention=attention,
                               scores=logits.masked_fill(~allowed, float("-inf")), values=v)
    logits = logits.masked_fill(~allowed, float("-inf"))
    empty_rows = ~allowed.any(dim=-1, keepdim=True)  # (B, 1, Lq, 1)
    # Softmax of a row of -inf is NaN; give those rows finite logits and apply the policy after.
    attention = torch.softmax(logits.masked_fill(empty_rows, 0.0), dim=-1)
    if fully_masked == "zeros":
        attention = attention.masked_fill(empty_rows, 0.0)
    elif fully_masked == "nan":
        attention = attention.masked_fill(empty_rows, float("nan"))
    # "uniform": softmax of equal (zero) logits already spreads evenly over every key.
    return ReferenceResult(output=attention_output(attention, v, w), attention=attention,
                           scores=logits, values=v)


def plain_attention(weights: HeadWeights, query: torch.Tensor, key: torch.Tensor,
                    value: torch.Tensor, *, keep: torch.Tensor | None, causal: bool,
                    dtype: torch.dtype, window: int | None = None,
                    encoding: PositionEncoding | None = None,
                    start: int = 0, dtype_tables: bool = True,
                    chunk: int | None = None) -> list[torch.Tensor]:
    """The suite's plain attention in ``dtype``, in both textbook orders (scale q first, scale
    the product), and with RoPE, also with its cos/sin tables computed in ``dtype`` (angles
    rounded there, as HuggingFace's and GPT-J's tables are), unless ``dtype_tables`` is False:
    past the positions a half dtype holds exactly (256 in bfloat16), its angles are a radian or
    more apart, which no correct long-context module computes with. The baselines a same-dtype
    implementation is measured against."""
    tables = (False, True) if (encoding is not None and encoding.rotary is not None
                               and dtype != torch.float64 and dtype_tables) else (False,)
    return [reference_attention(weights, query, key, value, keep=keep, causal=causal,
                                dtype=dtype, scale_first=first, window=window,
                                chunk=chunk, encoding=encoding, start=start,
                                tables_in_dtype=in_dtype).output
            for first in (True, False) for in_dtype in tables]
