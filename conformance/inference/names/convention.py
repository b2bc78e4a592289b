"""How ``forward`` is called, read from its signature."""

from __future__ import annotations

import enum
import inspect
import typing
from dataclasses import dataclass, field

from conformance.model.forms import PositionForm

QUERY_NAMES = ("q", "query", "queries", "x_q")
KEY_NAMES = ("k", "key", "keys", "x_k")
VALUE_NAMES = ("v", "value", "values", "x_v")
KEEP_MASK_NAMES = ("attention_mask", "mask", "src_mask", "padding_mask_keep", "attn_masks",
                   "attention_masks", "input_mask", "key_mask")
WEAK_MASK_NAMES = ("mask",)
"""Names whose polarity is a convention, not a promise: most code reads ``mask`` as 1/True =
attend, OpenNMT and others as True = masked. The other polarity is accepted, and doubted."""
IGNORE_MASK_NAMES = ("key_padding_mask", "padding_mask", "src_key_padding_mask", "pad_mask")
EITHER_MASK_NAMES = ("attn_mask",)
LENGTH_NAMES = ("valid_lens", "valid_len", "valid_lengths", "valid_length", "lengths", "lens",
                "seq_lens", "seq_lengths", "seqlens", "key_lengths", "kv_lens", "src_lens",
                "input_lengths", "x_lens", "sequence_lengths")
"""Integer lengths of the valid keys (d2l's ``valid_lens``, of shape (B,) or (B, Lq)): a mask in
another form, read by behaviour as the other masks are."""
BIAS_NAMES = ("attn_bias", "attention_bias", "bias", "position_bias", "mask_bias")
CAUSAL_NAMES = ("is_causal", "causal")
POSITION_NAMES = ("position_ids", "position_embeddings", "positions", "freqs_cis",
                  "rotary_pos_emb", "rope", "cos_sin", "pos_emb", "cache_position", "start_pos",
                  "input_pos", "pos_ids")
FILLABLE_POSITIONS = {"position_ids": PositionForm.IDS, "pos_ids": PositionForm.IDS,
                      "cache_position": PositionForm.VECTOR, "input_pos": PositionForm.VECTOR,
                      "start_pos": PositionForm.START}
"""Position arguments the suite can fill, and how (HuggingFace's (B, L) ``position_ids`` and
(L,) ``cache_position``, gpt-fast's ``input_pos``, Meta's int ``start_pos``); others
(``position_embeddings``, ``freqs_cis``) carry precomputed tables and are left to defaults."""
CACHE_NAMES = ("past_key_value", "past_key_values", "layer_past", "past", "kv_cache", "cache",
               "past_kv", "cache_kv")
START_NAMES = ("start_pos", "start_position", "seqlen_offset")
"""An int that says where new tokens go in buffers the module keeps (Meta Llama's cache)."""
USE_CACHE_NAMES = ("use_cache",)
SAME_ATTENTION_SWITCHES = ("need_weights", "output_attentions", "output_attention",
                           "return_attention", "return_attn", "return_weights",
                           "return_attention_weights", "return_attn_weights", "return_scores",
                           "return_attn_probs", "use_flash", "use_flash_attn", "flash", "use_sdpa",
                           "fused", "use_fused_attn", "fast_path", "use_memory_efficient",
                           "use_kernel")
"""Switches of forward whose two values claim the same attention: one returns the weights
beside the output, or runs another kernel for it. A path each value opens is held to the
other's output (``path_agreement``); a switch of another name is a setting of its own."""
SAME_ATTENTION_CHOICES = ("attn_implementation", "implementation", "impl", "attn_impl",
                          "backend", "attention_backend", "sdpa_backend", "kernel", "mode")
"""Arguments of a few values (a ``Literal``, an Enum) that choose how the same attention is
computed (``attn_impl: Literal["eager", "sdpa"]``): each choice a path held to the default's."""
NOT_SWITCHES = ("training", "return_dict")
"""Boolean arguments that are no path of the attention (train mode is the dropout check's; a
return_dict only wraps the same tensors)."""
PACKED_NAMES = ("cu_seqlens", "cu_seq_lens", "cu_seqlens_q", "cu_seqlen")
MAX_SEQLEN_NAMES = ("max_seqlen", "max_seqlen_q", "max_seq_len_in_batch")

NOT_A_CONTEXT = (*KEEP_MASK_NAMES, *IGNORE_MASK_NAMES, *EITHER_MASK_NAMES, *BIAS_NAMES, *LENGTH_NAMES,
                 *CAUSAL_NAMES, *POSITION_NAMES, *CACHE_NAMES, *START_NAMES, *USE_CACHE_NAMES,
                 *PACKED_NAMES, *MAX_SEQLEN_NAMES)
"""Names a second required argument has when it is no tensor of states to attend to."""

MaskFamily = str
"""The conventions a mask argument's name admits:

- ``keep``: 1/True = attend, or additive (``attention_mask``, ``mask``);
- ``ignore``: True = masked, or additive (``key_padding_mask``);
- ``either``: both boolean polarities are in real use under this name, or additive
  (``attn_mask``: True = attend for F.scaled_dot_product_attention, True = masked for
  nn.MultiheadAttention): the polarity is then decided by behaviour, and said so;
- ``additive``: a float bias added to the logits (``attn_bias``);
- ``lengths``: integer valid lengths, (B,) or (B, Lq) (``valid_lens``).
"""


def mask_family(name: str) -> MaskFamily:
    """The family a mask argument's name implies (a name ending in "mask" reads as ``keep``)."""
    if name in IGNORE_MASK_NAMES:
        return "ignore"
    if name in EITHER_MASK_NAMES:
        return "either"
    if name in BIAS_NAMES:
        return "additive"
    if name in LENGTH_NAMES:
        return "lengths"
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
    mask_name_settles: bool = True
    mask_required: bool = False
    switches: tuple[tuple[str, object, tuple[object, ...]], ...] = ()
    """Optional arguments no other role reads that switch between a few values (a bool; a
    ``Literal`` or an Enum), each with the value the suite's calls give it (its default;
    ``need_weights``: False) and its other values: the paths forward offers."""
    """The mask argument has no default: a call without a mask passes None for it (d2l's
    ``forward(queries, keys, values, valid_lens)``, whose None means no mask)."""
    """Whether the mask's name settles its polarity (``attention_mask``, ``key_padding_mask``);
    not for ``mask`` or an unknown name ending in "mask" (see WEAK_MASK_NAMES)."""
    causal: str | None = None
    need_weights: bool = False
    positions: tuple[str, ...] = field(default_factory=tuple)
    sequence_first: bool = False
    """Inputs are (length, batch, width), as nn.MultiheadAttention's default."""
    by_keyword: bool = False
    """Pass q, k, v by name: the signature orders them otherwise (OpenNMT's key, value, query)."""
    position_argument: str | None = None
    """A position argument the suite can fill (see FILLABLE_POSITIONS)."""
    position_required: bool = False
    cache: str | None = None
    """A KV cache argument: a past cache (``past_key_value``), or a start position into buffers
    the module keeps (``start_pos``, see START_NAMES)."""
    cache_annotation: object = None
    """The cache argument's annotation, as written (a class names a cache object's type)."""
    use_cache: str | None = None
    packed: str | None = None
    """A cu_seqlens argument (packed variable-length sequences)."""
    max_seqlen: str | None = None
    call_guessed: bool = False
    """q, k, v read from three required arguments whose names say nothing (not query/key/value
    names): a guess that behaviour must confirm (see :mod:`conformance.inference.calls.packed_call`)."""
    packed_only: bool = False
    """Its only input is packed tokens (total, D) with ``packed`` offsets (and ``max_seqlen``),
    FlashAttention's varlen form: a batch goes in as its sequences packed, and comes out
    unpacked."""

    def describe(self) -> str:
        if self.call == "self":
            text = f"self-attention forward({', '.join(self.inputs)}"
        elif self.call == "cross":
            text = f"cross-attention forward({', '.join(self.inputs)}"
        elif self.call == "latent":
            text = f"attention from queries of its own to forward({', '.join(self.inputs)}"
        else:
            text = f"forward({', '.join(self.inputs)}"
        if self.mask:
            text += f", {self.mask}"
        text += ")"
        if self.by_keyword:
            text += "; q, k, v passed by name (its signature orders them otherwise)"
        if self.packed_only:
            text = (f"packed self-attention forward({self.inputs[0]} (total, D), {self.packed}"
                    + (f", {self.max_seqlen}" if self.max_seqlen else "") + ")")
        return text


def _qkv_roles(names: list[str]) -> tuple[str, str, str] | None:
    """The first three names in (query, key, value) order, when they name one of each."""
    if len(names) < 3:
        return None
    found = {}
    for name in names:
        for role, known in (("q", QUERY_NAMES), ("k", KEY_NAMES), ("v", VALUE_NAMES)):
            if name in known:
                found.setdefault(role, name)
    if len(found) != 3:
        return None
    return found["q"], found["k"], found["v"]


def _switch(parameter: inspect.Parameter,
            function: object) -> tuple[str, object, tuple[object, ...]] | None:
    """(name, the value the suite's calls give it, its other values) for an optional argument
    that takes one of a few values: a bool, a ``Literal`` of choices, an Enum; else None."""
    default, name = parameter.default, parameter.name
    if isinstance(default, bool):
        value = False if name == "need_weights" else default
        return name, value, (not value,)
    if isinstance(default, enum.Enum):
        return name, default, tuple(member for member in type(default) if member != default)
    annotation = parameter.annotation
    if isinstance(annotation, str):  # postponed: read where forward was written
        try:
            annotation = typing.get_type_hints(function).get(name, annotation)
        except Exception:  # an annotation that does not resolve: no choices read from it
            return None
    if typing.get_origin(annotation) is typing.Literal and default in typing.get_args(annotation):
        return name, default, tuple(c for c in typing.get_args(annotation) if c != default)
    return None


def read_forward(function) -> ForwardConvention:
    """The convention of ``function`` (a bound ``forward`` or a plain function)."""
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"]
    names = [p.name for p in parameters]
    positional = [p.name for p in parameters if p.default is p.empty]
    roles = _qkv_roles(names[:3])
    is_qkv = roles is not None or len(positional) >= 3
    # Two required tensors, the second no mask, positions or cache: queries' states and the
    # states keys and values come from (a decoder's encoder_hidden_states). A guess behaviour
    # settles (see conformance.inference.calls.packed_call).
    is_cross = not is_qkv and len(positional) == 2 and positional[1] not in NOT_A_CONTEXT \
        and not positional[1].endswith("mask")
    inputs = roles or (tuple(names[:3]) if is_qkv else tuple(positional) if is_cross
                       else tuple(names[:1]))
    convention = ForwardConvention(call="qkv" if is_qkv else "cross" if is_cross else "self",
                                   inputs=inputs,
                                   by_keyword=roles is not None and roles != tuple(names[:3]),
                                   call_guessed=(is_qkv and roles is None) or is_cross)
    rest = names[len(inputs):]
    known = (*KEEP_MASK_NAMES, *IGNORE_MASK_NAMES, *EITHER_MASK_NAMES)
    named = next((n for n in rest if n in known), None)
    if named is None:
        named = next((n for n in rest if n.endswith("mask")), None)
    if named is None:
        named = next((n for n in rest if n in BIAS_NAMES), None)
    if named is None:
        named = next((n for n in rest if n in LENGTH_NAMES), None)
    by_name = {p.name: p for p in parameters}
    if named is not None:
        convention.mask, convention.mask_family = named, mask_family(named)
        convention.mask_name_settles = named not in WEAK_MASK_NAMES and named in (
            *known, *BIAS_NAMES, *LENGTH_NAMES)
        convention.mask_required = by_name[named].default is by_name[named].empty
    convention.causal = next((n for n in rest if n in CAUSAL_NAMES), None)
    convention.need_weights = "need_weights" in rest
    convention.positions = tuple(n for n in rest if n in POSITION_NAMES)
    fillable = next((n for n in rest if n in FILLABLE_POSITIONS), None)
    if fillable is not None:
        convention.position_argument = fillable
        convention.position_required = by_name[fillable].default is by_name[fillable].empty
    cache = next((n for n in rest if n in START_NAMES), None) or next(
        (n for n in rest if n in CACHE_NAMES), None)
    if cache is not None:
        convention.cache = cache
        convention.cache_annotation = by_name[cache].annotation
    convention.use_cache = next((n for n in rest if n in USE_CACHE_NAMES), None)
    taken = {convention.mask, convention.causal, convention.cache, convention.use_cache,
             fillable, *convention.positions, *NOT_SWITCHES}
    convention.switches = tuple(found for found in (_switch(by_name[n], function)
                                                    for n in rest if n not in taken) if found)
    convention.packed = next((n for n in rest if n in PACKED_NAMES), None)
    convention.max_seqlen = next((n for n in rest if n in MAX_SEQLEN_NAMES), None)
    return convention
