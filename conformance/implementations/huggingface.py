"""HuggingFace ``transformers`` eager attention modules, declared in a few lines each.

Needs the optional extra: ``pip install -e .[thirdparty]``. Both modules take a config object
(nothing to infer a width from) and return a tuple, so each gets a declaration:

- BERT's ``BertSelfAttention``: query/key/value linears, no output projection (that is
  ``BertSelfOutput``), an additive (B, 1, 1, Lk) mask, attention dropout.
- GPT-2's ``GPT2Attention``: fused ``c_attn`` and ``c_proj`` ``Conv1D`` layers (weights stored
  transposed). In transformers >= 5 the causal mask reaches it from the model through
  ``attention_mask``; the module alone is not causal, and is declared so.

Check them with ``attention-conformance check conformance.implementations.huggingface:IMPLEMENTATIONS``.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import BertConfig, GPT2Config
from transformers.models.bert.modeling_bert import BertSelfAttention
from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

from conformance import (
    Capabilities,
    Config,
    Dtypes,
    FusedProjection,
    Implementation,
    MaskConvention,
    MaskKind,
    MaskLayout,
    SeparateProjections,
)

ADDITIVE = MaskConvention(MaskKind.ADDITIVE, MaskLayout.BROADCAST, argument="attention_mask")
DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class FirstOutput(nn.Module):
    """The attention output of a module that returns (output, weights, ...)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, hidden_states: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return self.inner(hidden_states, **kwargs)[0]


def bert(config: Config) -> nn.Module:
    hf = BertConfig(hidden_size=config.d_model, num_attention_heads=config.num_heads,
                    attention_probs_dropout_prob=config.dropout)
    hf._attn_implementation = "eager"
    return FirstOutput(BertSelfAttention(hf))


def gpt2(config: Config) -> nn.Module:
    hf = GPT2Config(n_embd=config.d_model, n_head=config.num_heads, n_positions=64,
                    attn_pdrop=config.dropout, resid_pdrop=0.0)
    hf._attn_implementation = "eager"
    return FirstOutput(GPT2Attention(hf))


IMPLEMENTATIONS = [
    Implementation("hf-bert-self-attention", bert,
                   Capabilities(call="self", mask=ADDITIVE, floats=Dtypes(DTYPES), dropout="config"),
                   SeparateProjections(q="inner.query", k="inner.key", v="inner.value"),
                   description="transformers BertSelfAttention (eager)"),
    Implementation("hf-gpt2-attention", gpt2,
                   Capabilities(call="self", mask=ADDITIVE, floats=Dtypes(DTYPES), dropout="config"),
                   FusedProjection(qkv="inner.c_attn", o="inner.c_proj"),
                   description="transformers GPT2Attention (eager), Conv1D projections"),
]
