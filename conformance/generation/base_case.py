"""The small configuration every check starts from: the gate's basic call, the contract's and
stability's cases, a worker's preflight. Case building, not a check: it lives with the cases
(it was in the gate, which five checks and the runner imported for it)."""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.generation.cases import Case, dtype_name, own_queries
from conformance.generation.strategies import fixed_features, right_padding, shared_masks
from conformance.model.spec import Capabilities


def base_pair(caps: Capabilities) -> tuple[int, int]:
    """(num_heads, head_dim) of the small configuration: 2 heads of 4 (or the fixed count), or
    the buildable pair nearest to it."""
    fixed_kv = caps.kv_heads if isinstance(caps.kv_heads, int) else 1
    preferred = (caps.heads or 2 * fixed_kv, 4)
    if caps.shapes is None or preferred in caps.shapes:
        return preferred
    return min(caps.shapes, key=lambda p: (abs(p[0] - preferred[0]) + abs(p[1] - 4), p))


def base_case(caps: Capabilities, dtype: torch.dtype, device: str, **changes) -> Case:
    """The gate's small configuration: batch 2, length 5, 2 heads of 4 (see base_pair), causal
    where the implementation always is (the case says what it computes, as generated ones do).

    A mask (``kept``) is made the same for every batch element where the format is shared. A
    module that takes one length gets it, whatever length ``changes`` ask for; one that refuses
    short lengths on the device (``min_len``) gets no shorter ones."""
    length = caps.length_near(5)
    heads, head_dim = base_pair(caps)
    case = Case(batch=2, q_len=length, kv_len=length, num_heads=heads, head_dim=head_dim,
                dtype=dtype_name(dtype), device=device, seed=0, causal=caps.causality.kind == "always",
                **fixed_features(caps))
    case = own_queries(replace(case, **changes), caps)
    if caps.length is not None:  # the one length it takes, whatever length was asked for
        case = case.at_length(caps.length)
    elif caps.min_len is not None and min(case.q_len, case.kv_len) < caps.min_len:
        case = replace(case, kv_len=max(case.kv_len, caps.min_len),
                       q_len=max(case.q_len, caps.min_len) if caps.queries is None else case.q_len)
    if case.causal and case.q_len != case.kv_len and "causal" not in changes:
        case = replace(case, causal=False)  # causal cases have as many queries as keys
    if case.kept is not None and shared_masks(caps):
        case = replace(case, kept=(min(case.kept),) * case.batch, shared_mask=True)
    if case.kept is not None and right_padding(caps):
        case = replace(case, mask_seed=None)
    return case
