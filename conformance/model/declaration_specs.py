"""Every declaration, said once: its name, the grammar of its value, its help, and how it is read.

The command line's flags, pytest's ``--attention-declare``, the validation of a
``pyproject.toml`` table and of a rubric's ``interface``, and the reference table in the docs
(``docs/declarations.md``, written by ``python -m conformance.frontends.declarations_page``)
are all made from :data:`SPECS`, and so are the fields of
:class:`~conformance.model.declarations.Declarations`: a new declaration is one entry here (a
test adds one and finds it in every front end).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

Declarations = Any
"""A :class:`~conformance.model.declarations.Declarations`: made from this table, so never
imported here (the readers below call its methods)."""


class Form(str, Enum):
    """How a declaration's value is written on a command line."""

    VALUE = "value"
    """``--name VALUE``."""
    SWITCH = "switch"
    """``--name`` alone (``true`` in TOML)."""
    REPEATED = "repeated"
    """``--name VALUE`` again for each value (a list in TOML)."""


@dataclass(frozen=True)
class DeclarationSpec:
    """One declaration: ``name`` (the Declarations field), the ``grammar`` of its value, its
    ``help``, its ``choices`` where it is one of a few words, how it is written (``form``),
    the flag's name where it is not the name with dashes, ``read``, which parses it from
    Declarations (raising DeclarationError with one line) where more than a choice is checked,
    and the ``type`` of its value as Declarations holds it (text, unless ``form`` repeats
    it)."""

    name: str
    grammar: str
    help: str
    choices: tuple[str, ...] = ()
    form: Form = Form.VALUE
    flag_name: str | None = None
    read: Callable[[Declarations], object] | None = None
    type: Any = None

    @classmethod
    def one_of(cls, name: str, help: str, choices: tuple[str, ...]) -> DeclarationSpec:
        """A declaration whose value is one of a few words: its grammar is their list."""
        return cls(name, " | ".join(choices), help, choices)

    @property
    def value_type(self) -> Any:
        """What Declarations holds for it: ``str``, or a tuple of them where it repeats."""
        if self.type is not None:
            return self.type
        return tuple[str, ...] if self.form is Form.REPEATED else str

    @property
    def key(self) -> str:
        """How TOML and ``--attention-declare`` spell it: ``width-arg``."""
        return self.name.replace("_", "-")

    @property
    def flag(self) -> str:
        """The command line's flag (the front ends spell it; the table names it)."""
        return f"--{self.flag_name or self.key}"

    def check(self, declarations: Declarations) -> None:
        """Raise DeclarationError where the declared value does not parse."""
        if getattr(declarations, self.name) is None:
            return
        if self.choices:
            declarations.choice(self.name, self.choices)
        if self.read is not None:
            self.read(declarations)


SPECS: tuple[DeclarationSpec, ...] = (
    DeclarationSpec.one_of("call", "f(x, mask), f(q, k, v, mask), f(x, context, mask) or "
                           "f(x, mask) attending from queries of its own (latent)",
                           ("self", "qkv", "cross", "latent")),
    DeclarationSpec("mask", "KIND:LAYOUT[+causal][@ARG]",
                    "the padding mask: KIND keep_int, keep_int32, keep_bool, keep_float, "
                    "ignore_bool, additive (-inf), additive_min; LAYOUT key_padding (B, Lk), "
                    "broadcast (B, 1, 1, Lk), rows_broadcast (B, 1, Lk), per_query (B, Lq, Lk), "
                    "per_query_broadcast, "
                    "per_head (B, H, Lq, Lk), shared (Lq, Lk); or valid lengths, KIND lengths "
                    "with LAYOUT per_sequence (B,) or per_row (B, Lq); @ARG: the forward "
                    "keyword, e.g. additive:per_head@attn_bias, lengths:per_sequence@valid_lens",
                    read=lambda d: (d.mask_convention("mask"), d.mask_argument)),
    DeclarationSpec.one_of("causal",
                           "whether it masks the future (optional: through forward's causal argument)",
                           ("never", "always", "optional")),
    DeclarationSpec("width_arg", "NAME", "the constructor argument for the model width"),
    DeclarationSpec("heads_arg", "NAME", "the constructor argument for the head count"),
    DeclarationSpec("head_dim_arg", "NAME",
                    "the constructor argument for each head's width (head_size, d_k, ...)"),
    DeclarationSpec("sequence_first", "true", "forward takes (length, batch, width) inputs",
                    form=Form.SWITCH, read=lambda d: d.declares_sequence_first()),
    DeclarationSpec("batch_first", "true",
                    "forward takes (batch, length, width) inputs (never read sequence-first)",
                    form=Form.SWITCH, read=lambda d: d.declares_sequence_first()),
    DeclarationSpec.one_of("constructor",
                           "built with keywords (default) or Class(width, heads) by position",
                           ("keyword", "positional")),
    DeclarationSpec.one_of("returns",
                           "forward returns one tensor (a tuple is then a contract failure), or a tuple "
                           "whose first element is the output", ("tensor", "tuple")),
    DeclarationSpec.one_of("layout",
                           "a core function's q, k, v axes: (batch, heads, length, dim) or (batch, "
                           "length, heads, dim) (FlashAttention's)", ("bhld", "blhd")),
    DeclarationSpec.one_of("causal_alignment",
                           "a kernel's causal diagonal with fewer queries than keys: query i sees keys "
                           "<= i + kv_len - q_len (bottom-right, FlashAttention >= 2.1) or <= i "
                           "(top-left); measured where not declared", ("bottom-right", "top-left")),
    DeclarationSpec.one_of("kv_grouping",
                           "grouped-query heads: query head h reads key/value head h // G "
                           "(interleaved, HuggingFace's) or h mod Hkv (tiled)", ("interleaved", "tiled")),
    DeclarationSpec.one_of("padded_queries",
                           "what it outputs at a padded query position (self-attention): zero, "
                           "attention to itself alone, or as any row; unjudged unless declared",
                           ("zero", "self", "any")),
    DeclarationSpec.one_of("output_projection",
                           "the layer applies an output projection: a layer shaped like one that the "
                           "forward never calls is checked as it (a skipped projection then fails "
                           "reference)", ("applied",)),
    DeclarationSpec("rope", "PAIRING[:THETA[:FRACTION]]",
                    "RoPE as meant: half or interleaved pairs, theta, rotated fraction, e.g. "
                    "half:10000:0.25", read=lambda d: d.rotary()),
    DeclarationSpec("dtypes", "D,D,...",
                    "the dtypes it supports, e.g. float32,float64 (default: those two, and "
                    "float16/bfloat16 assumed: findings there are warnings)",
                    read=lambda d: d.dtype_list()),
    DeclarationSpec("weights", "q,k,v[,o] | fused:qkv[,o] | packed[:path] | none",
                    "where its projections are: submodule names, one fused projection, "
                    "nn.MultiheadAttention's packed in_proj, or none",
                    read=lambda d: d.weight_layout("inner")),
    DeclarationSpec("init", "NAME=VALUE", "a constructor keyword, e.g. causal=True (repeatable; "
                    "a table in TOML)", form=Form.REPEATED, type=tuple[tuple[str, object], ...]),
    DeclarationSpec("layer", "CLASS:NAME=VALUE",
                    "a declaration for the attention layers of one class inside a model, e.g. "
                    "LlamaAttention:kv-grouping=tiled (repeatable; a table of tables in TOML, "
                    "one per class)", form=Form.REPEATED, read=lambda d: d.layer_tables()),
    DeclarationSpec("mask_formats", "KIND:LAYOUT",
                    "another mask format it accepts (repeatable; a list in TOML)",
                    form=Form.REPEATED, flag_name="mask-format",
                    read=lambda d: d.alternative_masks("mask")),
    DeclarationSpec("paths", "NAME=VALUE",
                    "another way to call forward that computes the same attention, e.g. "
                    "need_weights=true (repeatable; a list in TOML): held to the default call's "
                    "output", form=Form.REPEATED, flag_name="path",
                    read=lambda d: d.path_list()),
    DeclarationSpec("kv_heads_arg", "NAME",
                    "the constructor argument for the key/value heads (grouped-query)"),
    DeclarationSpec("window_arg", "NAME[:keys|left]",
                    "the constructor argument for a causal sliding window: keys = the keys a row "
                    "sees, itself included (HuggingFace's sliding_window); left = the keys "
                    "before it (FlashAttention's window_size)", read=lambda d: d.window()),
    DeclarationSpec("chunk_arg", "NAME",
                    "the constructor argument for causal chunked attention (Llama 4's "
                    "attention_chunk_size): row t sees the positions of its own chunk of C up to "
                    "itself, C * (t // C) .. t"),
    DeclarationSpec.one_of("scale",
                           "the logit scale its design means: sqrt = 1/sqrt(head_dim), head_dim "
                           "= 1/head_dim (muP's, Granite's), none = unscaled (T5's); a measured "
                           "scale that differs fails",
                           ("sqrt", "head_dim", "none")),
    DeclarationSpec("positions", "NAME[:ids|vector|start]",
                    "the forward argument for the tokens' positions: (B, L) ids, an (L,) "
                    "vector, or the first position as an int", read=lambda d: d.position_argument()),
    DeclarationSpec.one_of("position_encoding",
                           "the position encoding inside (overrides what names suggest)",
                           ("rotary", "alibi", "none")),
    DeclarationSpec.one_of("alibi",
                           "ALiBi slopes: the paper's (standard), or any positive ones",
                           ("standard", "measured")),
    DeclarationSpec("kv_cache", "STYLE@ARG[=module:Class] | none",
                    "its KV cache: returned@past_key_value, buffers@start_pos, "
                    "object@cache=mypkg.cache:KVCache, or none", read=lambda d: d.cache()),
    DeclarationSpec("cache_layout", "bhld | blhd | bld",
                    "the form a returned KV cache must have: (k, v), each (batch, heads, length, "
                    "head_dim), (batch, length, heads, head_dim) or (batch, length, heads * "
                    "head_dim); a cache in another form fails kv_cache",
                    ("bhld", "blhd", "bld"), read=lambda d: d.cache_layout_form()),
    DeclarationSpec("packed", "FORM[@ARG]",
                    "packed sequences: cu_seqlens@ARG (tokens (1, T, D)), cu_seqlens_flat@ARG "
                    "(tokens (T, D)), or mask (a block-diagonal mask)",
                    read=lambda d: d.packing()),
    DeclarationSpec("config", "FILE.json",
                    "a transformers model (or a layer class built from a config) built from "
                    "this config (its config class's JSON, as save_pretrained writes it) instead "
                    "of the smallest model of its architecture, and checked as that instance is"),
    DeclarationSpec("attn_implementation", "NAME | module:function | FILE.py::function",
                    "a transformers model (or a layer class built from a config) built with "
                    "this attention function: a name registered with AttentionInterface (sdpa, "
                    "eager, flex_attention, your own), or a function in AttentionInterface's "
                    "form, registered under a name of its own"),
)
"""Every declaration, in the order the command line's help lists them."""

BY_NAME = {spec.name: spec for spec in SPECS}


def validate(declarations: Declarations) -> Declarations:
    """``declarations`` where every declared value parses; else DeclarationError, one line."""
    for spec in SPECS:
        spec.check(declarations)
    return declarations


__all__ = ["BY_NAME", "SPECS", "DeclarationSpec", "Form", "validate"]
