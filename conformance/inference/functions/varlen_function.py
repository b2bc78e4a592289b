"""Varlen kernels: ``f(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)``
over packed tokens (total, heads, head_dim), FlashAttention's ``flash_attn_varlen_func``.

Such a function is checked through a dense view of it (:func:`dense_view`): a batch (B, L, H, D)
goes in as B sequences of L tokens packed (cu_seqlens = [0, L, 2L, ...]), so every check of a
dense kernel applies; and the view takes ``cu_seqlens`` and ``max_seqlen`` itself, so the
``packed`` check hands it sequences of other lengths (an empty one included), each of which
must give what it gives alone.
"""

from __future__ import annotations

import inspect

import torch

from conformance.inference.functions.kernel_arguments import LSE_ARGUMENTS, call_output

VARLEN = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
"""FlashAttention's varlen arguments: the cumulative lengths (n + 1,) int32 and the longest
sequence, of the queries and of the keys."""


def is_varlen(function) -> bool:
    """Whether ``function`` takes FlashAttention's varlen arguments (its cumulative lengths by
    their names; behaviour then confirms through the packed check)."""
    try:
        names = set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return False
    return {"cu_seqlens_q", "cu_seqlens_k"} <= names


def _cumulative(count: int, length: int, device: torch.device) -> torch.Tensor:
    return torch.arange(count + 1, dtype=torch.int32, device=device) * length


def dense_view(function):
    """``attention(q, k, v, cu_seqlens=None, max_seqlen=None, **options)`` over
    (B, L, H, D) calling the varlen ``function``: without ``cu_seqlens``, each batch element one
    sequence; with them (the packed check's (1, total, H, D) tokens), those sequences, for the
    queries and the keys alike. ``options`` are the function's other keywords (a returned
    log-sum-exp is not read: its varlen shape is another's)."""
    parameters = list(inspect.signature(function).parameters.values())
    tensors = parameters[:3]
    others = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in parameters[3:]
              if p.name not in VARLEN and p.name not in LSE_ARGUMENTS
              and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]

    def attention(q, k, v, cu_seqlens=None, max_seqlen=None, **options):
        if cu_seqlens is None:
            batch, q_len, kv_len = q.shape[0], q.shape[1], k.shape[1]
            cu_q, cu_k = _cumulative(batch, q_len, q.device), _cumulative(batch, kv_len, q.device)
            longest_q, longest_k = q_len, kv_len
        else:
            batch, q_len = None, None
            cu_q = cu_k = cu_seqlens.to(device=q.device, dtype=torch.int32)
            longest_q = longest_k = int(max_seqlen if max_seqlen is not None
                                        else (cu_q[1:] - cu_q[:-1]).max())
        q, k, v = (t.flatten(0, 1) for t in (q, k, v))
        out = call_output(function(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                   max_seqlen_q=longest_q, max_seqlen_k=longest_k, **options))
        return out.unflatten(0, (batch, q_len)) if batch is not None else out[None]

    attention.__signature__ = inspect.Signature([
        *(p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.empty)
          for p in tensors),
        inspect.Parameter("cu_seqlens", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        inspect.Parameter("max_seqlen", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
        *others])
    attention.__name__ = attention.__qualname__ = getattr(function, "__name__", "varlen")
    attention.__module__ = getattr(function, "__module__", __name__)
    return attention
