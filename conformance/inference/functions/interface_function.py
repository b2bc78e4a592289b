"""Attention functions in the form a model calls them: ``transformers``' ``AttentionInterface``,
``f(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs)
-> (output, weights)``, with query, key and value (B, H, L, D), the output (B, Lq, H, D), and
key/value heads grouped through ``module.num_key_value_groups``.

Such a function is checked through a kernel view of it (:func:`kernel_view`), called as a model
calls it: a module that carries what the function reads of its layer (``num_key_value_groups``,
``is_causal``, ``training``, ``scaling``, ``head_dim``), the mask with the causal triangle folded
in (a model hands its attention function the whole mask, causality included; without a padding
mask, the triangle alone), ``scaling`` the layer's 1/sqrt(head_dim) unless a scale is given,
and the output read back from (B, Lq, H, D). The view takes the function's own names for the
mask and the scale (``attention_mask``, ``scaling``) and SDPA's for the rest (``is_causal``,
``dropout_p``), so everything inferred and checked of a kernel applies:
which mask form the function reads (a boolean keep mask, as ``sdpa_mask`` builds, or an additive
one, as ``eager_mask`` does) is found by behaviour, like any kernel's.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from conformance.inference.functions.kernel_arguments import call_output
from conformance.subject.masks import with_causality

TENSORS = ("query", "key", "value")
"""The per-head tensors, named as ``AttentionInterface`` names them."""


def is_interface_function(function) -> bool:
    """Whether ``function`` has ``AttentionInterface``'s form: a first parameter ``module``,
    then query, key, value and ``attention_mask`` (by their names; behaviour then decides the
    rest)."""
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return False
    return len(names) >= 5 and names[0] == "module" and tuple(names[1:4]) == TENSORS \
        and names[4] == "attention_mask"


class CallingLayer(nn.Module):
    """What an attention function reads of the layer that calls it: the grouping of key/value
    heads, whether it is causal, its scale and head width (as ``LlamaAttention`` holds them)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int, *, causal: bool,
                 scaling: float, dropout: float) -> None:
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = heads, kv_heads, head_dim
        self.num_key_value_groups = heads // kv_heads
        self.is_causal, self.scaling, self.attention_dropout = causal, scaling, dropout
        self.train(dropout > 0)


def _with_causality(mask: torch.Tensor | None, q_len: int, kv_len: int,
                    like: torch.Tensor) -> torch.Tensor:
    """``mask`` (keep-boolean or additive) with the causal triangle folded in, as a model folds it
    (query i sees keys up to i + kv_len - q_len); the triangle alone, additive, where none."""
    visible = with_causality(torch.ones(1, kv_len, dtype=torch.bool, device=like.device),
                             q_len)[0]
    if mask is not None and mask.dtype == torch.bool:
        return mask & visible
    blocked = torch.zeros(q_len, kv_len, dtype=like.dtype, device=like.device).masked_fill(
        ~visible, torch.finfo(like.dtype).min)
    if mask is None:
        return blocked[None, None]
    return (mask.to(like.dtype) + blocked).clamp(min=torch.finfo(like.dtype).min)


def kernel_view(function):
    """``attention(query, key, value, attention_mask=None, is_causal=False, scaling=None,
    dropout_p=0.0)`` over (B, H, L, D) calling ``function`` as a model does (see the module
    docstring)."""
    takes_more = any(p.kind is inspect.Parameter.VAR_KEYWORD
                     for p in inspect.signature(function).parameters.values())

    def attention(query, key, value, attention_mask=None, is_causal=False, scaling=None,
                  dropout_p=0.0):
        heads, q_len, head_dim = query.shape[1], query.shape[2], query.shape[3]
        scaling = head_dim ** -0.5 if scaling is None else float(scaling)
        layer = CallingLayer(heads, key.shape[1], head_dim, causal=bool(is_causal),
                             scaling=scaling, dropout=float(dropout_p))
        mask = (_with_causality(attention_mask, q_len, key.shape[2], query) if is_causal
                else attention_mask)
        options = {"is_causal": bool(is_causal)} if takes_more else {}
        out = call_output(function(layer, query, key, value, mask, scaling=scaling,
                                   dropout=float(dropout_p), **options))
        return out.transpose(1, 2)  # (B, Lq, H, D) as a model reads it, back to (B, H, Lq, D)

    attention.__name__ = attention.__qualname__ = getattr(function, "__name__", "attention")
    attention.__module__ = getattr(function, "__module__", __name__)
    return attention
