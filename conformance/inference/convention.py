"""How ``forward`` is called, read from its signature."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

QUERY_NAMES = ("q", "query", "queries", "x_q")
KEY_NAMES = ("k", "key", "keys", "x_k")
VALUE_NAMES = ("v", "value", "values", "x_v")
KEEP_MASK_NAMES = ("attention_mask", "mask", "src_mask", "padding_mask_keep", "attn_masks",
                   "attention_masks", "input_mask", "key_mask")
IGNORE_MASK_NAMES = ("key_padding_mask", "padding_mask", "src_key_padding_mask", "pad_mask")
EITHER_MASK_NAMES = ("attn_mask",)
BIAS_NAMES = ("attn_bias", "attention_bias", "bias", "position_bias", "mask_bias")
CAUSAL_NAMES = ("is_causal", "causal")
POSITION_NAMES = ("position_ids", "position_embeddings", "positions", "freqs_cis",
                  "rotary_pos_emb", "rope", "cos_sin", "pos_emb")

MaskFamily = str
"""The conventions a mask argument's name admits:

- ``keep``: 1/True = attend, or additive (``attention_mask``, ``mask``);
- ``ignore``: True = masked, or additive (``key_padding_mask``);
- ``either``: both boolean polarities are in real use under this name, or additive
  (``attn_mask``: True = attend for F.scaled_dot_product_attention, True = masked for
  nn.MultiheadAttention): the polarity is then decided by behaviour, and said so;
- ``additive``: a float bias added to the logits (``attn_bias``).
"""


def mask_family(name: str) -> MaskFamily:
    """The family a mask argument's name implies (a name ending in "mask" reads as ``keep``)."""
    if name in IGNORE_MASK_NAMES:
        return "ignore"
    if name in EITHER_MASK_NAMES:
        return "either"
    if name in BIAS_NAMES:
        return "additive"
    return "keep"


@dataclass
class ForwardConvention:
    """What ``forward``'s signature says.

    ``mask_family``: see :data:`MaskFamily`. ``positions``: arguments that carry positions
    (RoPE's ``position_ids``, ``position_embeddings``, ...), left to the module's defaults.
    """

    call: str
    inputs: tuple[str, ...]
    mask: str | None = None
    mask_family: MaskFamily | None = None
    causal: str | None = None
    need_weights: bool = False
    positions: tuple[str, ...] = field(default_factory=tuple)
    sequence_first: bool = False
    """Inputs are (length, batch, width), as nn.MultiheadAttention's default."""

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
    known = (*KEEP_MASK_NAMES, *IGNORE_MASK_NAMES, *EITHER_MASK_NAMES)
    named = next((n for n in rest if n in known), None)
    if named is None:
        named = next((n for n in rest if n.endswith("mask")), None)
    if named is None:
        named = next((n for n in rest if n in BIAS_NAMES), None)
    if named is not None:
        convention.mask, convention.mask_family = named, mask_family(named)
    convention.causal = next((n for n in rest if n in CAUSAL_NAMES), None)
    convention.need_weights = "need_weights" in rest
    convention.positions = tuple(n for n in rest if n in POSITION_NAMES)
    return convention
