"""Declarations of the seed variants: how the suite builds each one and what it promises.

The seed modules stay exactly as written; everything the suite needs to know about them lives
here. Each factory maps a generated :class:`~conformance.Config` onto the seed's constructor.
"""

from __future__ import annotations

import torch

from conformance import (
    Capabilities,
    CausalForm,
    Dtypes,
    FusedProjection,
    Implementation,
    MaskConvention,
    MaskKind,
    MaskLayout,
    PerHeadModules,
    SeparateProjections,
)
import conformance.implementations.seed000_multihead_self_attention as seed000
import conformance.implementations.seed001_self_attention_steps as seed001
import conformance.implementations.seed002_multihead_attention_qkv as seed002
import conformance.implementations.seed003_causal_multihead_attention as seed003
import conformance.implementations.seed004_multihead_attention_q_length as seed004

BLOCK_SIZE = 32
"""Seed 003's causal buffer size: the longest sequence its modules accept."""

ALL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
"""Every seed is built from nn.Linear and plain tensor ops, so it is declared (and judged) in
every floating dtype a user would run it in."""

INT_MASK_BROADCAST = MaskConvention(MaskKind.KEEP_INT, MaskLayout.BROADCAST)
INT_MASK_FORMATS = (
    MaskConvention(MaskKind.KEEP_INT, MaskLayout.PER_HEAD),  # the (B, H, Lq, Lk) form 000 uses
    MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.BROADCAST),  # `mask == 0` reads bools too
)
SEED_DROPOUT = 0.1
"""The rate seeds 000 and 001 hard-code (DROPOUT_PROB, nn.Dropout(0.1))."""


IMPLEMENTATIONS = [
    Implementation(
        "seed000-MultiHeadAttention",
        lambda c: seed000.MultiHeadAttention(c.d_model, c.num_heads),
        Capabilities(call="self", mask=INT_MASK_BROADCAST, mask_formats=INT_MASK_FORMATS,
                     floats=Dtypes(ALL_DTYPES), dropout=SEED_DROPOUT, fully_masked="uniform"),
        SeparateProjections(q="q_proj", k="k_proj", v="v_proj", o="out_proj"),
        description="seed 000: MultiHeadAttention(hidden_dim, nums_head), prints in forward",
    ),
    Implementation(
        "seed001-SelfAttentionOne",
        lambda c: seed001.SelfAttentionOne(c.d_model, c.d_model),
        Capabilities(call="self", heads=1, floats=Dtypes(ALL_DTYPES)),
        SeparateProjections(q="linear_q", k="linear_k", v="linear_v"),
        description="seed 001 step 1: single head, separate q/k/v linears, no mask",
    ),
    Implementation(
        "seed001-SelfAttentionTwo",
        lambda c: seed001.SelfAttentionTwo(c.d_model, c.d_model),
        Capabilities(call="self", heads=1, floats=Dtypes(ALL_DTYPES)),
        FusedProjection(qkv="linear_qkv"),
        description="seed 001 step 2: single head, fused qkv linear",
    ),
    Implementation(
        "seed001-SelfAttentionThree",
        lambda c: seed001.SelfAttentionThree(c.d_model, c.d_model),
        Capabilities(call="self", heads=1,
                     mask=MaskConvention(MaskKind.KEEP_INT, MaskLayout.PER_QUERY),
                     mask_formats=(MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.PER_QUERY),),
                     floats=Dtypes(ALL_DTYPES), dropout=SEED_DROPOUT, fully_masked="uniform"),
        SeparateProjections(q="q", k="k", v="v"),
        description="seed 001 step 3: (B, Lq, Lk) mask, dropout on the scores before softmax",
    ),
    Implementation(
        "seed001-MultiHeadAttention",
        lambda c: seed001.MultiHeadAttention(c.d_model, c.num_heads),
        Capabilities(call="self", mask=INT_MASK_BROADCAST, mask_formats=INT_MASK_FORMATS,
                     floats=Dtypes(ALL_DTYPES), dropout=SEED_DROPOUT, fully_masked="uniform"),
        SeparateProjections(q="q_proj", k="k_proj", v="v_proj", o="o_proj"),
        description="seed 001 step 4: MultiHeadAttention(hidden_dim, nums_head), o_proj",
    ),
    Implementation(
        "seed002-MultiHeadAttention",
        lambda c: seed002.MultiHeadAttention(c.num_heads, c.d_model, c.dropout),
        Capabilities(call="qkv", mask=INT_MASK_BROADCAST, mask_formats=INT_MASK_FORMATS,
                     cross_attention=True, floats=Dtypes(ALL_DTYPES), dropout="config",
                     fully_masked="uniform"),
        SeparateProjections(q="q_linear", k="k_linear", v="v_linear", o="out"),
        description="seed 002: MultiHeadAttention(heads, d_model, dropout), forward(q, k, v, mask)",
    ),
    Implementation(
        "seed003-MultiHeadAttention",
        lambda c: seed003.MultiHeadAttention(c.d_model, c.d_model, BLOCK_SIZE, c.dropout,
                                             c.num_heads),
        Capabilities(call="self", causality=CausalForm("always"), max_len=BLOCK_SIZE, floats=Dtypes(ALL_DTYPES),
                     dropout="config"),
        SeparateProjections(q="W_query", k="W_key", v="W_value", o="out_proj"),
        description="seed 003: causal MultiHeadAttention(d_in, d_out, block_size, ...)",
    ),
    Implementation(
        "seed003-MultiHeadAttentionWrapper",
        lambda c: seed003.MultiHeadAttentionWrapper(c.d_model, c.head_dim, BLOCK_SIZE, c.dropout,
                                                    c.num_heads),
        Capabilities(call="self", causality=CausalForm("always"), max_len=BLOCK_SIZE, floats=Dtypes(ALL_DTYPES),
                     dropout="config"),
        PerHeadModules(heads="heads", q="W_query", k="W_key", v="W_value"),
        description="seed 003: num_heads CausalAttention heads concatenated, no output projection",
    ),
    Implementation(
        "seed004-MultiHeadAttention",
        lambda c: seed004.MultiHeadAttention(c.d_model, c.num_heads),
        Capabilities(call="qkv", mask=INT_MASK_BROADCAST, mask_formats=INT_MASK_FORMATS,
                     cross_attention=True, floats=Dtypes(ALL_DTYPES), fully_masked="uniform"),
        SeparateProjections(q="w_q", k="w_k", v="w_v", o="w_o"),
        description="seed 004: MultiHeadAttention(d_model, num_heads), k/v use q's length",
    ),
]
