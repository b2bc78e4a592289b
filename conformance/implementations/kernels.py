"""Attention kernels written the way FlashAttention-2 is, in pure torch: half precision only, a
blockwise forward with an online softmax, and a backward written by hand from the saved
log-sum-exp.

They are here to be checked as a researcher's kernel is, with nothing declared
(``attention-conformance check conformance.implementations.kernels:half_attention``): each
refuses float32 and float64 as FlashAttention does, so every check runs in float16 and bfloat16.
:class:`Kernel` holds each step of the computation as a method, so that the broken twins in
:mod:`conformance.implementations.kernel_mutants` override the one step their bug lives in.

The math (per head, scale s, keys visible under the causal alignment):
  forward: S = s Q K^T, P = softmax(S), O = P V, lse = logsumexp(S) per row;
  backward: P = exp(S - lse), dV = P^T dO, dP = dO V^T, D = rowsum(dO * O) (= rowsum(dP * P)),
  dS = P * (dP - D), dQ = s dS K, dK = s dS^T Q.
Causal attention is aligned bottom-right (FlashAttention >= 2.1, SDPA's lower-right): query i of
Lq sees key j of Lk where j <= i + Lk - Lq. A row that sees no key gives 0.
"""

from __future__ import annotations

import math

import torch

BLOCK = 16
"""Keys per block of the online softmax: generated lengths above it take several blocks."""

HALF = (torch.float16, torch.bfloat16)


class Kernel:
    """The kernel's steps; a broken twin overrides one."""

    def visible(self, q_len: int, start: int, stop: int, kv_len: int,
                device: torch.device) -> torch.Tensor:
        """(Lq, stop - start) bool: which keys of the block each query sees under causality."""
        rows = torch.arange(q_len, device=device)[:, None]
        cols = torch.arange(start, stop, device=device)[None, :]
        return cols <= rows + (kv_len - q_len)

    def scores(self, q: torch.Tensor, k: torch.Tensor, scale: float, causal: bool,
               start: int, kv_len: int) -> torch.Tensor:
        """Scaled logits of one key block, -inf where causality hides the key (float32)."""
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        if causal:
            seen = self.visible(q.shape[-2], start, start + k.shape[-2], kv_len, q.device)
            s = s.masked_fill(~seen, float("-inf"))
        return s

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

    def forward(self, q, k, v, scale: float, causal: bool):
        """(O in q's dtype, lse (B, H, Lq, 1) float32)."""
        kv_len = k.shape[-2]
        shape = (*q.shape[:-1], 1)
        m = torch.full(shape, float("-inf"), device=q.device)
        total = torch.zeros(shape, device=q.device)
        acc = torch.zeros((*q.shape[:-1], v.shape[-1]), device=q.device)
        for start in range(0, kv_len, BLOCK):
            s = self.scores(q, k[..., start:start + BLOCK, :], scale, causal, start, kv_len)
            new = torch.maximum(m, s.amax(-1, keepdim=True))
            safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
            p = torch.exp(s - safe)
            alpha = torch.exp(m - safe)
            total = total * alpha + p.sum(-1, keepdim=True)
            acc = acc * alpha + p @ v[..., start:start + BLOCK, :].float()
            m = new
        seen = total > 0
        out = torch.where(seen, acc / torch.where(seen, total, torch.ones_like(total)), 0.0)
        safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        lse = torch.where(seen, safe + torch.log(torch.where(seen, total, torch.ones_like(total))),
                          float("-inf"))
        return out.to(q.dtype), lse

    def backward(self, q, k, v, out, lse, dout, scale: float, causal: bool):
        kv_len = k.shape[-2]
        do = self.read_dout(dout)
        delta = (do * out.float()).sum(-1, keepdim=True)
        dq = torch.zeros(q.shape, device=q.device)
        dks, dvs = [], []
        finite = torch.isfinite(lse)
        for start in range(0, kv_len, BLOCK):
            kb, vb = k[..., start:start + BLOCK, :], v[..., start:start + BLOCK, :]
            s = self.scores(q, kb, scale, causal, start, kv_len)
            p = torch.where(finite, torch.exp(s - torch.where(finite, lse, 0.0)), 0.0)
            dvs.append(self.dv(p, do, lse, s))
            dp = do @ vb.float().transpose(-1, -2)
            ds = self.ds(p, dp, delta)
            dq = dq + ds @ kb.float() * scale
            dks.append(self.dk(ds, q.float(), scale))
        return (dq.to(q.dtype), torch.cat(dks, -2).to(k.dtype), torch.cat(dvs, -2).to(v.dtype))


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, kernel: Kernel, scale: float, causal: bool):
        out, lse = kernel.forward(q, k, v, scale, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.kernel, ctx.scale, ctx.causal = kernel, scale, causal
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(q, k, v, out, lse, dout, ctx.scale, ctx.causal)
        return dq, dk, dv, None, None, None


def _refuse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dtype not in HALF or k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError("this kernel only supports float16 and bfloat16 (got "
                           f"{q.dtype}, {k.dtype}, {v.dtype})")


def kernel_function(kernel: Kernel, layout: str = "bhld", name: str = "attention"):
    """``attention(q, k, v, causal=False, softmax_scale=None)`` over (B, H, L, D) (``bhld``) or
    FlashAttention's (B, L, H, D) (``blhd``), computed by ``kernel``."""

    def attention(q, k, v, causal=False, softmax_scale=None):
        _refuse(q, k, v)
        scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(q.shape[-1])
        if layout == "blhd":
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = _Attention.apply(q, k, v, kernel, scale, bool(causal))
        return out.transpose(1, 2) if layout == "blhd" else out

    attention.__name__ = attention.__qualname__ = name
    attention.__module__ = type(kernel).__module__
    attention.layout = layout  # for tests that call it directly; the suite probes it
    return attention


half_attention = kernel_function(Kernel(), "bhld", "half_attention")
"""FlashAttention-2's algorithm over (batch, heads, length, head_dim), float16/bfloat16 only."""

flash_layout_half_attention = kernel_function(Kernel(), "blhd", "flash_layout_half_attention")
"""The same kernel over FlashAttention's (batch, length, heads, head_dim)."""

KERNELS = (half_attention, flash_layout_half_attention)
