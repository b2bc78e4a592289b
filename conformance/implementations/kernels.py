"""Attention kernels written the way FlashAttention-2 is, in pure torch: half precision only, a
blockwise forward with an online softmax, and a backward written by hand from the saved
log-sum-exp.

They are here to be checked as a researcher's kernel is, with nothing declared
(``attention-conformance check conformance.implementations.kernels:half_attention``): each
refuses float32 and float64 as FlashAttention does, so every check runs in float16 and bfloat16.
Four forms: over (B, H, L, D), over FlashAttention's (B, L, H, D), over packed tokens with
cu_seqlens (``flash_attn_varlen_func``'s), and writing new keys and values into caches it is
handed (``flash_attn_with_kvcache``'s).
:class:`Kernel` holds each step of the computation as a method, so that the broken twins in
:mod:`conformance.implementations.kernel_mutants` override the one step their bug lives in.

The math (per head, scale s, keys visible under the causal alignment and the window, an
optional softcap c):
  forward: S = s Q K^T (c tanh(S / c) with a softcap, before masking), P = softmax(S), O = P V,
  lse = logsumexp(S) per row (natural log; returned as (B, H, Lq) with ``return_lse=True``);
  backward: P = exp(S - lse), dV = P^T dO, dP = dO V^T, D = rowsum(dO * O) (= rowsum(dP * P)),
  dS = P * (dP - D), dQ = s dS K, dK = s dS^T Q.
Causal attention is aligned bottom-right (FlashAttention >= 2.1, SDPA's lower-right): query i of
Lq sees key j of Lk where j <= i + Lk - Lq; ``window_size=(left, right)`` lets it see keys
i + Lk - Lq - left .. i + Lk - Lq + right (-1: unbounded), as FlashAttention's. A row that sees
no key gives 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BLOCK = 16
"""Keys per block of the online softmax: generated lengths above it take several blocks."""

HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Options:
    """One call's arguments beyond the tensors."""

    scale: float
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    dropout: float = 0.0
    alibi: torch.Tensor | None = None
    """ALiBi slopes (H,): head h's logits get -m_h |i + Lk - Lq - j| (FlashAttention's)."""


class Kernel:
    """The kernel's steps; a broken twin overrides one."""

    def visible(self, q_len: int, start: int, stop: int, kv_len: int, options: Options,
                device: torch.device) -> torch.Tensor:
        """(Lq, stop - start) bool: which keys of the block each query sees (causality and the
        window, both aligned bottom-right)."""
        rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
        cols = torch.arange(start, stop, device=device)[None, :]
        seen = torch.ones(q_len, stop - start, dtype=torch.bool, device=device)
        left, right = options.window
        if options.causal:
            right = 0 if right < 0 else min(right, 0)
        if left >= 0:
            seen = seen & (cols >= rows - left)
        if right >= 0:
            seen = seen & (cols <= rows + right)
        return seen

    def capped(self, s: torch.Tensor, options: Options) -> torch.Tensor:
        """The softcap c tanh(s / c), where one is given."""
        return options.softcap * torch.tanh(s / options.softcap) if options.softcap else s

    def bias(self, q_len: int, start: int, stop: int, kv_len: int, options: Options,
             device: torch.device) -> torch.Tensor | float:
        """ALiBi's bias of a block (H, Lq, block) where slopes are given, else 0."""
        if options.alibi is None:
            return 0.0
        rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
        cols = torch.arange(start, stop, device=device)[None, :]
        return -options.alibi.float().to(device)[:, None, None] * (rows - cols).abs()

    def scores(self, q: torch.Tensor, k: torch.Tensor, options: Options, start: int,
               kv_len: int) -> torch.Tensor:
        """Scaled (biased, capped) logits of one key block, -inf where a key is hidden
        (float32)."""
        s = (q.float() @ k.float().transpose(-1, -2)) * options.scale + self.bias(
            q.shape[-2], start, start + k.shape[-2], kv_len, options, q.device)
        s = self.capped(s, options)
        seen = self.visible(q.shape[-2], start, start + k.shape[-2], kv_len, options, q.device)
        return s.masked_fill(~seen, float("-inf"))

    def capped_grad(self, ds: torch.Tensor, s: torch.Tensor, options: Options) -> torch.Tensor:
        """dS through the softcap: d(c tanh(x / c))/dx = 1 - tanh(x / c)^2 = 1 - (S / c)^2."""
        if not options.softcap:
            return ds
        finite = torch.where(torch.isfinite(s), s, torch.zeros_like(s))
        return ds * (1 - (finite / options.softcap) ** 2)

    def lse(self, m: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        """The row's log-sum-exp from its running max and sum (natural log): the backward's."""
        return m + torch.log(total)

    def returned_lse(self, m: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        """The log-sum-exp handed to the caller with ``return_lse``."""
        return self.lse(m, total)

    def read_dout(self, dout: torch.Tensor) -> torch.Tensor:
        """The incoming cotangent, as the backward reads it."""
        return dout.float()

    def dv(self, p: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
           s: torch.Tensor) -> torch.Tensor:
        """dV of a key block: P^T dO, with P the normalised probabilities."""
        return p.transpose(-1, -2) @ dout

    def ds(self, p: torch.Tensor, dp: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """The softmax Jacobian applied: dS = P * (dP - rowsum(dO * O))."""
        return p * (dp - delta)

    def dk(self, ds: torch.Tensor, q: torch.Tensor, scale: float) -> torch.Tensor:
        return ds.transpose(-1, -2) @ q * scale

    def cached(self, k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor | None,
               v: torch.Tensor | None, held: list[int],
               block_table: torch.Tensor | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each batch element's keys and values (L, H, D): its new ones written into the caches
        (in place) after the ``held`` tokens there, then read back. Every write comes first: the
        keys read are views of the caches, which no later write may change (their backward
        reads them). With a ``block_table``, the caches are pages (blocks, page, H, D) and token
        t of element b lives in page ``block_table[b, t // page]`` at ``t % page``."""
        lengths = list(held)
        if k is not None:
            for b, start in enumerate(held):
                lengths[b] = start + k.shape[1]
                slots = self.slots(block_table, b, start, lengths[b], k_cache)
                k_cache[slots] = k[b]
                v_cache[slots] = v[b]
        return [(k_cache[self.slots(block_table, b, 0, length, k_cache)],
                 v_cache[self.slots(block_table, b, 0, length, k_cache)])
                for b, length in enumerate(lengths)]

    def slots(self, block_table: torch.Tensor | None, b: int, start: int, stop: int,
              cache: torch.Tensor) -> tuple:
        """Where tokens start .. stop of element ``b`` live in a cache (an index)."""
        if block_table is None:
            return (b, slice(start, stop))
        page = cache.shape[1]
        positions = torch.arange(start, stop, device=cache.device)
        return (block_table[b, positions // page].long(), positions % page)

    def sequence(self, cu_seqlens: torch.Tensor, index: int) -> slice:
        """The tokens of packed sequence ``index``: cu_seqlens[index] .. cu_seqlens[index + 1]."""
        return slice(int(cu_seqlens[index]), int(cu_seqlens[index + 1]))

    def grouped(self, gradient: torch.Tensor, groups: int) -> torch.Tensor:
        """A key/value gradient over the query heads (B, H, Lk, D), summed over each group of
        ``groups`` query heads that shares one key/value head: (B, H / groups, Lk, D)."""
        return gradient.unflatten(1, (-1, groups)).sum(2)

    def dropout_mask(self, shape: tuple[int, ...], options: Options,
                     device: torch.device) -> torch.Tensor | None:
        """(B, H, Lq, Lk) bool, the weights kept (each with probability 1 - p), drawn once for
        the forward and its backward; None without dropout."""
        if not options.dropout:
            return None
        return torch.rand(shape, device=device) >= options.dropout

    def dropped(self, p: torch.Tensor, kept: torch.Tensor | None, start: int,
                options: Options) -> torch.Tensor:
        """A block's weights after dropout: the kept ones scaled by 1 / (1 - p)."""
        if kept is None:
            return p
        return p * kept[..., start:start + p.shape[-1]] / (1 - options.dropout)

    def forward(self, q, k, v, options: Options, kept: torch.Tensor | None = None):
        """(O in q's dtype, the backward's lse (B, H, Lq, 1) float32, the caller's)."""
        kv_len = k.shape[-2]
        shape = (*q.shape[:-1], 1)
        m = torch.full(shape, float("-inf"), device=q.device)
        total = torch.zeros(shape, device=q.device)
        acc = torch.zeros((*q.shape[:-1], v.shape[-1]), device=q.device)
        for start in range(0, kv_len, BLOCK):
            s = self.scores(q, k[..., start:start + BLOCK, :], options, start, kv_len)
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
            p = torch.exp(s - safe)
            alpha = torch.exp(m - safe)
            total = total * alpha + p.sum(-1, keepdim=True)
            acc = acc * alpha + self.dropped(p, kept, start, options) @ v[
                ..., start:start + BLOCK, :].float()
            m = new
        seen = total > 0
        out = torch.where(seen, acc / torch.where(seen, total, torch.ones_like(total)), 0.0)
        safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        total = torch.where(seen, total, torch.ones_like(total))
        lse, returned = (torch.where(seen, f(safe, total), float("-inf"))
                         for f in (self.lse, self.returned_lse))
        return out.to(q.dtype), lse, returned

    def backward(self, q, k, v, out, lse, dout, options: Options,
                 kept: torch.Tensor | None = None):
        kv_len = k.shape[-2]
        do = self.read_dout(dout)
        delta = (do * out.float()).sum(-1, keepdim=True)
        dq = torch.zeros(q.shape, device=q.device)
        dks, dvs = [], []
        finite = torch.isfinite(lse)
        for start in range(0, kv_len, BLOCK):
            kb, vb = k[..., start:start + BLOCK, :], v[..., start:start + BLOCK, :]
            s = self.scores(q, kb, options, start, kv_len)
            p = torch.where(finite, torch.exp(s - torch.where(finite, lse, 0.0)), 0.0)
            dvs.append(self.dv(self.dropped(p, kept, start, options), do, lse, s))
            dp = self.dropped(do @ vb.float().transpose(-1, -2), kept, start, options)
            ds = self.capped_grad(self.ds(p, dp, delta), s, options)
            dq = dq + ds @ kb.float() * options.scale
            dks.append(self.dk(ds, q.float(), options.scale))
        return (dq.to(q.dtype), torch.cat(dks, -2).to(k.dtype), torch.cat(dvs, -2).to(v.dtype))


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kernel: Kernel, options: Options):
        groups = q.shape[1] // k.shape[1]  # grouped key/value heads: query head h reads h // G
        kept = kernel.dropout_mask((*q.shape[:-1], k.shape[-2]), options, q.device)
        out, lse, returned = kernel.forward(q, *_expanded(k, v, groups), options, kept)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kernel, ctx.options, ctx.groups, ctx.kept = kernel, options, groups, kept
        ctx.mark_non_differentiable(returned)
        return out, returned

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(q, *_expanded(k, v, ctx.groups), out, lse, dout,
                                         ctx.options, ctx.kept)
        if ctx.groups > 1:
            dk, dv = (ctx.kernel.grouped(g, ctx.groups) for g in (dk, dv))
        return dq, dk, dv, None, None


def _expanded(k: torch.Tensor, v: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Key/value heads repeated for the query heads that share them (h // G)."""
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)


def _refuse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> None:
    if q.dtype not in HALF or k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("this kernel only supports float16 and bfloat16 (got "
                           f"{q.dtype}, {k.dtype}, {v.dtype})")
    if q.shape[heads] % k.shape[heads] or k.shape[heads] != v.shape[heads]:
        raise RuntimeError(f"number of query heads ({q.shape[heads]}) must be a multiple of "
                           f"the key/value heads ({k.shape[heads]}, {v.shape[heads]})")


def kernel_function(kernel: Kernel, layout: str = "bhld", name: str = "attention"):
    """``attention(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_lse=False)`` (FlashAttention's
    order) over
    (B, H, L, D) (``bhld``) or FlashAttention's (B, L, H, D) (``blhd``), computed by
    ``kernel``; k and v may have fewer heads, a divisor of q's (query head h reads key/value
    head h // G, as FlashAttention's); with ``return_lse``, ``(out, lse)`` with lse (B, H, Lq)
    float32, as FlashAttention's ``softmax_lse``; ``dropout_p`` drops each weight with that
    probability (kept ones scaled by 1 / (1 - p)), the same draw in the backward."""

    def attention(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                  softcap=0.0, alibi_slopes=None, return_lse=False):
        _refuse(q, k, v, 1 if layout == "bhld" else 2)
        scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(q.shape[-1])
        options = Options(scale, bool(causal), tuple(window_size), float(softcap),
                          float(dropout_p), alibi_slopes)
        if layout == "blhd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out, lse = _Attention.apply(q, k, v, kernel, options)
        out = out.transpose(1, 2) if layout == "blhd" else out
        return (out, lse.squeeze(-1)) if return_lse else out

    attention.__name__ = attention.__qualname__ = name
    attention.__module__ = type(kernel).__module__
    attention.layout = layout  # for tests that call it directly; the suite probes it
    return attention


def varlen_kernel_function(kernel: Kernel, name: str = "varlen_attention"):
    """``attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    causal=False, softmax_scale=None)`` over packed tokens (total, H, D), FlashAttention's
    ``flash_attn_varlen_func``: each sequence i, queries cu_seqlens_q[i] .. cu_seqlens_q[i + 1]
    over keys cu_seqlens_k[i] .. cu_seqlens_k[i + 1], computed by ``kernel`` (an empty
    sequence gives nothing)."""
    dense = kernel_function(kernel, "bhld")

    def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                  softmax_scale=None):
        _refuse(q, k, v, 1)
        pieces = []
        for i in range(len(cu_seqlens_q) - 1):
            queries = slice(int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]))
            keys = kernel.sequence(cu_seqlens_k, i)
            if queries.stop == queries.start:
                continue
            one = [t[s].transpose(0, 1)[None] for t, s in ((q, queries), (k, keys), (v, keys))]
            pieces.append(dense(*one, causal=causal, softmax_scale=softmax_scale)[0]
                          .transpose(0, 1))
        return torch.cat(pieces) if pieces else q.new_zeros(q.shape)

    attention.__name__ = attention.__qualname__ = name
    attention.__module__ = type(kernel).__module__
    attention.layout = "varlen"
    return attention


def cache_kernel_function(kernel: Kernel, name: str = "attention_with_kvcache"):
    """``attention(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
    causal=False, softmax_scale=None)`` over (B, L, H, D), FlashAttention's
    ``flash_attn_with_kvcache``: the new keys and values ``k``, ``v`` are written into the caches
    at ``cache_seqlens`` (in place), and the queries attend over each batch element's cache up
    to them (the whole cache where ``cache_seqlens`` is None), causal aligned bottom-right; with
    a ``block_table`` the caches are pages (see :meth:`Kernel.cached`)."""
    dense = kernel_function(kernel, "blhd")

    def attention(q, k_cache, v_cache, k=None, v=None, cache_seqlens=None, block_table=None,
                  causal=False, softmax_scale=None):
        _refuse(q, k_cache, v_cache, 2)
        if cache_seqlens is None:
            return dense(q, k_cache, v_cache, causal=causal, softmax_scale=softmax_scale)
        held = [int(n) for n in cache_seqlens]
        return torch.cat([dense(q[b:b + 1], keys[None], values[None], causal=causal,
                                softmax_scale=softmax_scale)
                          for b, (keys, values) in enumerate(kernel.cached(
                              k_cache, v_cache, k, v, held, block_table))])

    attention.__name__ = attention.__qualname__ = name
    attention.__module__ = type(kernel).__module__
    attention.layout = "cache"
    return attention


half_attention = kernel_function(Kernel(), "bhld", "half_attention")
"""FlashAttention-2's algorithm over (batch, heads, length, head_dim), float16/bfloat16 only."""

flash_layout_half_attention = kernel_function(Kernel(), "blhd", "flash_layout_half_attention")
"""The same kernel over FlashAttention's (batch, length, heads, head_dim)."""

varlen_half_attention = varlen_kernel_function(Kernel(), "varlen_half_attention")
"""The same kernel over packed tokens (total, heads, head_dim) with cu_seqlens."""

kvcache_half_attention = cache_kernel_function(Kernel(), "kvcache_half_attention")
"""The same kernel writing new keys and values into caches it is handed (B, S, H, D)."""

KERNELS = (half_attention, flash_layout_half_attention, varlen_half_attention,
           kvcache_half_attention)
