"""How packed variable-length sequences go into a forward with a cu_seqlens argument: the tokens
flattened to (total, D), as FlashAttention's varlen functions take them, or kept (1, total, D).

Probed: a call with two sequences packed in each form; the first whose output has the tokens'
shape is taken. What the packed output is worth is the packed check's to judge.
"""

from __future__ import annotations

from collections.abc import Callable

from conformance.generation.cases import Case
from conformance.model.forms import PackedForm
from conformance.subject.boundary import ImplementationError, Inputs, Instance


def probe_form(build: Callable[..., Instance], case: Case, call: str, argument: str,
               max_seqlen: str | None) -> PackedForm | None:
    """The packed form a call works in, or None."""
    x = case.tensor(1, case.q_len, case.d_model)
    half = case.q_len // 2
    segments = (half, case.q_len - half)
    for form in (PackedForm.CU_SEQLENS_FLAT, PackedForm.CU_SEQLENS):
        context = x.clone()
        inputs = Inputs(x, x, x, causal=case.causal, segments=segments) if call == "self" else \
            Inputs(x, context, context if call == "cross" else x.clone(), causal=case.causal,
                   segments=segments)
        try:
            output = build(packing={"form": form, "argument": argument,
                                    "max_seqlen_argument": max_seqlen}).forward(inputs)
        except ImplementationError:
            continue
        if tuple(output.shape) == tuple(x.shape):
            return form
    return None
