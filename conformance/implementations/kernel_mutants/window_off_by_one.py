"""Kernel mutant: the window's left edge one key short.

Bug: the window test is ``j > i - left`` where FlashAttention's ``window_size=(left, right)``
means ``j >= i - left``: each query sees left keys before it, not left + 1 counting the first.
Symptom: exact without a window (every other check); with ``window_size=(2, 0)`` each query
misses the oldest key of its window. Caught by: ``kernel``.
"""

from __future__ import annotations

import torch

from conformance.implementations.kernels import Kernel, kernel_function

CATCHES = "kernel"
EXPOSED_BY = {"window_size": (2, 0)}
"""The arguments under which it differs from the correct kernel (with fewer queries than keys)."""


class WindowOffByOne(Kernel):
    def visible(self, q_len, start, stop, kv_len, options, device):
        seen = super().visible(q_len, start, stop, kv_len, options, device)
        left = options.window[0]
        if left >= 0:
            rows = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
            cols = torch.arange(start, stop, device=device)[None, :]
            seen = seen & (cols > rows - left)
        return seen


KERNEL = kernel_function(WindowOffByOne(), "bhld", "window_off_by_one")
