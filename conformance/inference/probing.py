"""Behaviour the signature can't tell: the mask convention, and causality.

Mask: only conventions of the family the argument's name implies are tried (``attention_mask``
and ``mask``: 1/True = attend, or additive; ``key_padding_mask``: True = ignored, or additive).
A convention is accepted when masked keys are invisible (perturbing them changes no row) and the
kept keys are not (perturbing them does). If none of the family does that, the other family is
tried only to say what the bug looks like ("the complement works: inverted?"); it is never
accepted. Every convention tried is reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from conformance.adapter import ImplementationError, Instance
from conformance.cases import Case
from conformance.spec import MaskConvention, MaskKind, MaskLayout
from conformance.tolerance import abs_error, unchanged_tolerance

FAMILIES = {
    "keep": [
        MaskConvention(MaskKind.KEEP_INT, MaskLayout.BROADCAST, "mask"),
        MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.BROADCAST, "mask"),
        MaskConvention(MaskKind.KEEP_INT, MaskLayout.KEY_PADDING, "mask"),
        MaskConvention(MaskKind.KEEP_BOOL, MaskLayout.KEY_PADDING, "mask"),
        MaskConvention(MaskKind.KEEP_INT, MaskLayout.PER_QUERY, "mask"),
        MaskConvention(MaskKind.KEEP_INT, MaskLayout.PER_HEAD, "mask"),
        MaskConvention(MaskKind.ADDITIVE, MaskLayout.BROADCAST, "mask"),
        MaskConvention(MaskKind.ADDITIVE, MaskLayout.KEY_PADDING, "mask"),
    ],
    "ignore": [
        MaskConvention(MaskKind.IGNORE_BOOL, MaskLayout.KEY_PADDING, "mask"),
        MaskConvention(MaskKind.IGNORE_BOOL, MaskLayout.BROADCAST, "mask"),
        MaskConvention(MaskKind.ADDITIVE, MaskLayout.KEY_PADDING, "mask"),
    ],
}


def probe_case(num_heads: int, **changes: object) -> Case:
    """The probes' small case: batch 2, length 6, head_dim 4; key 1 keeps 3 keys, key 2 keeps 4."""
    return replace(Case(batch=2, q_len=6, kv_len=6, num_heads=num_heads, head_dim=4, seed=3,
                        kept=(3, 4)), **changes)


def mask_behaviour(instance: Instance, case: Case, call: str,
                   convention: MaskConvention) -> str | None:
    """None when ``convention`` makes masked keys invisible and kept keys visible, else why not."""
    inputs = replace(case.inputs(call), mask_convention=convention)
    keep = inputs.keep
    rows = keep if inputs.is_self else torch.ones_like(keep)
    try:
        before = instance.forward(inputs)
        masked = instance.forward(case.replace_positions(inputs, ~keep, stream=5, scale=5.0))
        kept = instance.forward(case.replace_positions(inputs, keep, stream=5, scale=5.0))
    except ImplementationError as error:
        return str(error)
    if tuple(before.shape[:2]) != tuple(inputs.query.shape[:2]):
        return f"output has shape {tuple(before.shape)}"
    tolerance = unchanged_tolerance(before.dtype, before)
    if float((abs_error(masked, before) * rows[:, :, None]).max()) > tolerance:
        return "masked keys still change the output"
    if float((abs_error(kept, before) * rows[:, :, None]).max()) <= tolerance:
        return "kept keys don't change the output"
    return None


def infer_mask(build: Callable[[MaskConvention], Instance], case: Case, call: str,
               family: str) -> tuple[MaskConvention, list[str], str | None]:
    """(convention, what was tried, a problem to report or None).

    ``build(convention)`` makes an instance that is called with that convention.
    """
    tried = []
    for convention in FAMILIES[family]:
        problem = mask_behaviour(build(convention), case, call, convention)
        if problem is None:
            return convention, tried, None
        tried.append(f"{convention.describe()}: {problem}")
    other = "ignore" if family == "keep" else "keep"
    for convention in FAMILIES[other]:
        if convention.kind is MaskKind.ADDITIVE:
            continue
        if mask_behaviour(build(convention), case, call, convention) is None:
            return FAMILIES[family][0], tried, (
                f"no '{family}' convention its name implies makes masked keys invisible, but "
                f"{convention.describe()} does: is the mask inverted?")
    return FAMILIES[family][0], tried, "no convention tried makes masked keys invisible"


def is_causal(instance: Instance, case: Case, call: str) -> bool:
    """Whether rows 0..2 ignore every input after position 2 (while later rows do change)."""
    inputs = case.inputs(call, use_mask=False)
    later = torch.zeros(case.batch, case.kv_len, dtype=torch.bool)
    later[:, 3:] = True
    before = instance.forward(inputs)
    change = abs_error(instance.forward(case.replace_positions(inputs, later, stream=5, scale=5.0,
                                                             query_too=True)), before)
    tolerance = unchanged_tolerance(before.dtype, before)
    return float(change[:, :3].max()) <= tolerance and float(change[:, 3:].max()) > tolerance
