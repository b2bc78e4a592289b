"""How the modern implementations (:mod:`conformance.implementations.modern`) are declared: one
function per family of modules (Llama-shaped, ALiBi, Meta's buffered cache, packed sequences),
which the mutants reuse to declare the module they break.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from conformance import (
    AlibiBias,
    CacheForm,
    CacheStyle,
    Capabilities,
    CausalForm,
    Dtypes,
    FusedProjection,
    Implementation,
    MaskConvention,
    MaskKind,
    MaskLayout,
    PackedForm,
    Packing,
    PositionEncoding,
    PositionForm,
    Positions,
    Rotary,
    SeparateProjections,
    Setting,
)
from conformance.model.capability_groups import laid_over

ALL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


KEEP_INT_PADDING = MaskConvention(MaskKind.KEEP_INT, MaskLayout.KEY_PADDING, "attention_mask")
KEEP_INT_PER_QUERY = MaskConvention(MaskKind.KEEP_INT, MaskLayout.PER_QUERY, "attention_mask")
ROTARY = "rotary position embeddings (RoPE)"
ALIBI = "ALiBi position biases"
ROPE_THETA_ARGUMENT = ((Setting.ROPE_THETA, "rope_theta"),)
"""A constructor whose ``rope_theta`` sets RoPE's base (``configuration`` varies it)."""
HALF_SPLIT_ROPE = PositionEncoding(rotary=Rotary("half", 10000.0))
INTERLEAVED_ROPE = PositionEncoding(rotary=Rotary("interleaved", 10000.0))


def declare_llama(name: str, module: type[nn.Module], *, description: str,
                  benchmark: bool = True, **capabilities: object) -> Implementation:
    """A LlamaAttention-shaped module: grouped-query heads from the configuration, RoPE at
    position_ids, the legacy tuple cache, a (B, Lk) keep mask; ``capabilities`` override (a
    group's, as a mapping of the fields that differ: ``position={"argument": None}``)."""
    declared = laid_over(dict(
        call="self", causality=CausalForm("always"), mask=KEEP_INT_PADDING, floats=Dtypes(ALL_DTYPES),
        fully_masked="nan", kv_heads="config",
        position=Positions(positional=ROTARY, relative="rotary", encoding=HALF_SPLIT_ROPE,
                           argument="position_ids", form=PositionForm.IDS),
        cache=CacheForm(style=CacheStyle.RETURNED, argument="past_key_value",
                        options=(("use_cache", True),))), capabilities)
    position = declared["position"]
    if position.positional is None and "encoding" not in capabilities.get("position", {}):
        # no RoPE inside: none for the reference either
        declared["position"] = replace(position, encoding=None)
    window = declared.get("window")

    def factory(c):
        settings = dict(c.settings)  # another value of a declared setting (configuration)
        if window is None:
            return module(c.d_model, c.num_heads, c.num_kv_heads, **settings)
        return module(c.d_model, c.num_heads, c.num_kv_heads, sliding_window=c.window,
                      **settings)

    return Implementation(
        name, factory, Capabilities(**declared),
        SeparateProjections(q="q_proj", k="k_proj", v="v_proj", o="o_proj"),
        description=description, benchmark=benchmark)


def declare_alibi(name: str, module: type[nn.Module], *, description: str,
                  benchmark: bool = False) -> Implementation:
    """An AlibiAttention-shaped module: the paper's slopes, a KVCache object as ``cache``."""
    return Implementation(
        name, lambda c: module(c.d_model, c.num_heads),
        Capabilities(call="self", causality=CausalForm("always"), mask=KEEP_INT_PADDING,
                     floats=Dtypes(ALL_DTYPES), fully_masked="nan",
                     position=Positions(positional=ALIBI, relative="alibi", alibi="standard",
                                        encoding=PositionEncoding(alibi=AlibiBias())),
                     cache=CacheForm(style=CacheStyle.OBJECT, argument="cache",
                                     factory="conformance.implementations.modern:KVCache")),
        SeparateProjections(q="q_proj", k="k_proj", v="v_proj", o="o_proj"),
        description=description, benchmark=benchmark)


def declare_buffered(name: str, module: type[nn.Module], *, description: str,
                     benchmark: bool = False) -> Implementation:
    """A MetaLlamaAttention-shaped module: preallocated cache buffers written at start_pos."""
    # Buffers as long as the configuration's sequence and a margin: what a model allocates for
    # the longest sequence it will see.
    return Implementation(
        name, lambda c: module(c.d_model, c.num_heads, c.num_kv_heads,
                               max_seq_len=max(c.q_len, c.kv_len) + 64),
        Capabilities(call="self", causality=CausalForm("always"), floats=Dtypes(ALL_DTYPES),
                     kv_heads="config",
                     position=Positions(positional=ROTARY, relative="rotary",
                                        encoding=INTERLEAVED_ROPE),
                     cache=CacheForm(style=CacheStyle.BUFFERS, argument="start_pos",
                                     max_batch=8)),
        SeparateProjections(q="wq", k="wk", v="wv", o="wo"),
        description=description, benchmark=benchmark)


def declare_varlen(name: str, module: type[nn.Module], *, description: str,
                   benchmark: bool = False) -> Implementation:
    """A VarlenAttention-shaped module: flat tokens with cu_seqlens and max_seqlen."""
    return Implementation(
        name, lambda c: module(c.d_model, c.num_heads, c.num_kv_heads),
        Capabilities(call="self", causality=CausalForm("always"), floats=Dtypes(ALL_DTYPES),
                     kv_heads="config",
                     packing=Packing(form=PackedForm.CU_SEQLENS_FLAT, argument="cu_seqlens",
                                     max_seqlen_argument="max_seqlen")),
        FusedProjection(qkv="qkv", o="out"),
        description=description, benchmark=benchmark)
