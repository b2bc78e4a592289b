"""Mutant: a padding mask that replaces the causal mask.

Bug: ``allowed = keep if attention_mask is not None else causal``: with a mask the module
attends as the mask says and forgets the causal triangle (the way HuggingFace's 4-D masks are
meant, but this module is given a (B, Lk) padding mask, which carries no causality).
Symptom: without a mask it is causal; with a padding mask every row sees the future.
Caught by: ``causal`` (with a padding mask given; its hint: causal without a mask, not with the
padding mask given).
"""

from __future__ import annotations

import torch

from conformance.implementations.modern import LlamaAttention
from conformance.implementations.modern_declared import declare_llama

CATCHES = "causal"


class MaskDropsCausality(LlamaAttention):
    def allowed(self, q_len: int, kv_len: int, device: torch.device,
                causal: bool) -> torch.Tensor:
        allowed = super().allowed(q_len, kv_len, device, causal)
        return allowed if self._masked is None else torch.ones_like(allowed)

    def forward(self, x, attention_mask=None, position_ids=None, past_key_value=None,
                use_cache=False):
        self._masked = attention_mask
        return super().forward(x, attention_mask, position_ids, past_key_value, use_cache)


IMPLEMENTATION = declare_llama("mutant-mask-drops-causality", MaskDropsCausality,
                               benchmark=False,
                               description="a padding mask given replaces the causal mask")
