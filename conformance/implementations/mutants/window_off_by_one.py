"""Mutant: a sliding window one key too wide.

Bug: ``i - j <= W`` where ``i - j < W`` is meant: row t sees W + 1 keys, t - W .. t (the
FlashAttention ``window_size=(W, 0)`` count mixed up with HuggingFace's ``sliding_window=W``).
Symptom: the token just outside the window still influences the row. Caught by:
``sliding_window`` (and the windowed reference: ``reference``, ``head_split``, ...).
"""

from __future__ import annotations

import torch

from conformance.implementations.modern import SlidingWindowAttention
from conformance.implementations.modern_declared import declare_llama

CATCHES = "sliding_window"


class WindowOffByOne(SlidingWindowAttention):
    def allowed(self, q_len, kv_len, device, causal):
        rows = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        cols = torch.arange(kv_len, device=device)[None, :]
        return (cols <= rows) & (rows - cols <= self.window)


IMPLEMENTATION = declare_llama(
    "mutant-window-off-by-one", WindowOffByOne, window="config",
    position={"positional": None, "relative": None, "argument": None, "form": None}, benchmark=False,
    description="sliding window i - j <= W: one key too wide")
