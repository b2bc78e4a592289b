"""A forward attention kernel written in Triton, as a researcher writes one, and its broken twin.

``triton_attention(q, k, v, causal=False, softmax_scale=None)`` over (B, H, L, D): the online
softmax of FlashAttention-2 over blocks of 16 queries and 16 keys, accumulated in float32, for
float16 and bfloat16 (bfloat16 on CUDA only: the interpreter has none) and any head_dim up to
128; causal aligned bottom-right (query i of Lq sees
key j of Lk where j <= i + Lk - Lq); a row that sees no key gives 0. Forward only (no backward is
written: the output carries no gradient). It runs on CUDA, or on a CPU under Triton's
interpreter (``TRITON_INTERPRET=1``, numpy < 2.3), where the tests run it; elsewhere, and where
Triton is not installed, it raises, and ``check`` says where it runs.

``triton_attention_tail_unmasked``: the same kernel without the bound check on the last block's
keys. BROKEN: past Lk, the block loads zeros as keys and values, so every row also weights those
phantom keys at logit 0 (their values 0): the output shrinks wherever Lk is not a multiple of 16
and the call is not causal (a causal row never reaches past its own key). Caught by: reference
(and padding-free checks that compare with the float64 reference).

Check them as a kernel author would: ``attention-conformance check
conformance.implementations.triton_attention:triton_attention --device cuda``.
"""

from __future__ import annotations

import functools
import math
import os

import torch

BLOCK = 16
"""Queries and keys per block (Triton's dot needs 16 at least)."""

MAX_HEAD_DIM = 128


def triton_available() -> str | None:
    """Why the kernel can't run here, or None where it can (Triton installed, and CUDA or the
    interpreter)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed (pip install triton)"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton kernels run on CUDA, or on a CPU under TRITON_INTERPRET=1"
    return None


@functools.cache
def _kernel(tail_masked: bool):
    import triton
    import triton.language as tl

    @triton.jit
    def forward(Q, K, V, Out, sqb, sqh, sql, skb, skh, skl, svb, svh, svl, sob, soh, sol,
                H, LQ, LK, D, scale, CAUSAL: tl.constexpr, MASK_TAIL: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sql + dims[None, :],
                    mask=(rows[:, None] < LQ) & (dims[None, :] < D), other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start_n in range(0, LK, BLOCK_N):
            keys = start_n + cols
            inside = (keys[:, None] < LK) & (dims[None, :] < D)
            k = tl.load(K + b * skb + h * skh + keys[:, None] * skl + dims[None, :],
                        mask=inside, other=0.0)
            v = tl.load(V + b * svb + h * svh + keys[:, None] * svl + dims[None, :],
                        mask=inside, other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            visible = rows[:, None] >= 0  # every key, to begin with
            if MASK_TAIL:
                visible = visible & (keys[None, :] < LK)
            if CAUSAL:
                visible = visible & (keys[None, :] <= rows[:, None] + LK - LQ)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet
            p = tl.exp(s - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that sees no key gives 0
        tl.store(Out + b * sob + h * soh + rows[:, None] * sol + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=(rows[:, None] < LQ) & (dims[None, :] < D))

    return forward


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
               softmax_scale: float | None, tail_masked: bool) -> torch.Tensor:
    problem = triton_available()
    if problem is not None:
        raise RuntimeError(problem)
    if q.dtype not in (torch.float16, torch.bfloat16) or not q.dtype == k.dtype == v.dtype:
        raise TypeError(f"triton_attention takes float16 or bfloat16, got {q.dtype}")
    if q.dtype is torch.bfloat16 and not q.is_cuda:
        # Triton's interpreter computes in numpy, which has no bfloat16 (its results are
        # garbage there): on a CPU the kernel refuses it, on CUDA it runs.
        raise TypeError("triton_attention takes bfloat16 on CUDA only (Triton's interpreter "
                        "has no bfloat16)")
    if q.dim() != 4 or q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"(B, H, L, D) with D <= {MAX_HEAD_DIM}, got {tuple(q.shape)}")
    if k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k and v (B, H, Lk, D) with q's B, H and D: got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    import triton

    batch, heads, q_len, head_dim = q.shape
    kv_len = k.shape[2]
    q, k, v = (t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    grid = (triton.cdiv(q_len, BLOCK), batch * heads)
    with torch.no_grad():
        _kernel(tail_masked)[grid](
            q, k, v, out, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            heads, q_len, kv_len, head_dim, scale, CAUSAL=causal, MASK_TAIL=tail_masked,
            BLOCK_M=BLOCK, BLOCK_N=BLOCK,
            BLOCK_D=max(BLOCK, triton.next_power_of_2(head_dim)))
    return out


def triton_attention(q, k, v, causal=False, softmax_scale=None):
    """softmax(softmax_scale q k^T [causal, bottom-right]) v over (B, H, L, D), in Triton."""
    return _attention(q, k, v, causal, softmax_scale, tail_masked=True)


def triton_attention_tail_unmasked(q, k, v, causal=False, softmax_scale=None):
    """BROKEN twin: the last block's keys past Lk are not masked (see the module docstring)."""
    return _attention(q, k, v, causal, softmax_scale, tail_masked=False)
