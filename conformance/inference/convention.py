"""How ``forward`` is called, read from its signature."""

from __future__ import annotations

import inspect
from dataclasses import dataclass

QUERY_NAMES = ("q", "query", "queries", "x_q")
KEY_NAMES = ("k", "key", "keys", "x_k")
VALUE_NAMES = ("v", "value", "values", "x_v")
KEEP_MASK_NAMES = ("attention_mask", "mask", "attn_mask", "src_mask", "padding_mask_keep")
IGNORE_MASK_NAMES = ("key_padding_mask", "padding_mask", "src_key_padding_mask")
CAUSAL_NAMES = ("is_causal", "causal")


@dataclass
class ForwardConvention:
    """What ``forward``'s signature says.

    ``mask_family``: "keep" when the mask's name means 1/True = attend (attention_mask, mask,
    attn_mask), "ignore" when it means True = masked (key_padding_mask).
    """

    call: str
    inputs: tuple[str, ...]
    mask: str | None = None
    mask_family: str | None = None
    causal: str | None = None
    need_weights: bool = False

    def describe(self) -> str:
        if self.call == "self":
            text = f"self-attention forward({', '.join(self.inputs)}"
        else:
            text = f"forward({', '.join(self.inputs)}"
        if self.mask:
            text += f", {self.mask}"
        return text + ")"


def read_forward(function) -> ForwardConvention:
    """The convention of ``function`` (a bound ``forward`` or a plain function)."""
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"]
    names = [p.name for p in parameters]
    positional = [p.name for p in parameters if p.default is p.empty]
    is_qkv = (len(names) >= 3 and names[0] in QUERY_NAMES and names[1] in KEY_NAMES
              and names[2] in VALUE_NAMES) or len(positional) >= 3
    inputs = tuple(names[:3]) if is_qkv else tuple(names[:1])
    convention = ForwardConvention(call="qkv" if is_qkv else "self", inputs=inputs)
    rest = names[len(inputs):]
    for name in rest:
        if name in IGNORE_MASK_NAMES:
            convention.mask, convention.mask_family = name, "ignore"
            break
        if name in KEEP_MASK_NAMES or (name.endswith("mask") and convention.mask is None):
            convention.mask, convention.mask_family = name, "keep"
            if name in KEEP_MASK_NAMES:
                break
    convention.causal = next((n for n in rest if n in CAUSAL_NAMES), None)
    convention.need_weights = "need_weights" in rest
    return convention
