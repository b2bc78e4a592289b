"""Torch's own attention kernels as a kernel author calls them, over (B, H, L, D):
``fn(q, k, v, causal=False, softmax_scale=None)``, each held to one backend, and a broken twin.

- ``sdpa_flash``, ``sdpa_efficient``, ``sdpa_cudnn``, ``sdpa_math``:
  ``F.scaled_dot_product_attention`` under ``sdpa_kernel([backend])``. Where the device, dtype or
  shape has no such kernel, torch raises ("No available kernel"): that is the kernel's contract
  (FLASH runs float16 and bfloat16 on CUDA, every float dtype on a CPU; EFFICIENT and CUDNN
  CUDA only), which inference states.
- ``flex_compiled``: ``torch.compile(flex_attention)``, causal through a block mask (bottom-right
  when queries are fewer than keys). On a CPU it raises for inputs that require gradients
  ("FlexAttention does not support backward on CPU"): forward only there.
- ``sdpa_flash_scale_dropped``: BROKEN, ``softmax_scale`` never reaches the kernel (the default
  1/sqrt(D) always applies). Caught by: kernel.

Checked as ``attention-conformance check conformance.implementations.torch_kernels:sdpa_flash
--device cuda``; ``benchmarks/gpu_acceptance.sh`` runs them all on a GPU.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right


def _held(backend: SDPBackend, q, k, v, causal: bool, softmax_scale: float | None):
    mask = None
    if causal and q.shape[-2] != k.shape[-2]:  # bottom-right, as FlashAttention >= 2.1
        # torch's own lower-right bias, not a boolean mask: FLASH takes no mask on CUDA (seen
        # on an H200: "No available kernel"), and this bias reaches its causal kernel there.
        mask = causal_lower_right(q.shape[-2], k.shape[-2])
        causal = False
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              scale=softmax_scale)


def sdpa_flash(q, k, v, causal=False, softmax_scale=None):
    """SDPA held to FLASH_ATTENTION."""
    return _held(SDPBackend.FLASH_ATTENTION, q, k, v, causal, softmax_scale)


def sdpa_efficient(q, k, v, causal=False, softmax_scale=None):
    """SDPA held to EFFICIENT_ATTENTION (memory-efficient, xFormers')."""
    return _held(SDPBackend.EFFICIENT_ATTENTION, q, k, v, causal, softmax_scale)


def sdpa_cudnn(q, k, v, causal=False, softmax_scale=None):
    """SDPA held to CUDNN_ATTENTION."""
    return _held(SDPBackend.CUDNN_ATTENTION, q, k, v, causal, softmax_scale)


def sdpa_math(q, k, v, causal=False, softmax_scale=None):
    """SDPA held to MATH (the unfused reference path)."""
    return _held(SDPBackend.MATH, q, k, v, causal, softmax_scale)


def sdpa_flash_scale_dropped(q, k, v, causal=False, softmax_scale=None):
    """BROKEN twin of :func:`sdpa_flash`: ``softmax_scale`` is accepted and never passed on."""
    return _held(SDPBackend.FLASH_ATTENTION, q, k, v, causal, None)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_compiled(q, k, v, causal=False, softmax_scale=None):
    """``torch.compile(flex_attention)``; causal through a block mask, aligned bottom-right."""
    from torch.nn.attention.flex_attention import create_block_mask

    block_mask = None
    if causal:
        offset = k.shape[-2] - q.shape[-2]

        def bottom_right(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + offset

        block_mask = create_block_mask(bottom_right, None, None, q.shape[-2], k.shape[-2],
                                       device=q.device)
    return _compiled_flex()(q, k, v, block_mask=block_mask, scale=softmax_scale)
