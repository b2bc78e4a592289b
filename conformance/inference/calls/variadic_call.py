"""A forward that takes ``*args`` or ``**kwargs`` and names no input: how to call it, by trial.

Its signature says nothing, so the call forms the suite knows are tried in order (one tensor by
position, as self-attention's ``forward(x)``; three, as ``forward(q, k, v)``; then by keyword,
``x=``, ``hidden_states=``, ``query=, key=, value=``, ``q=, k=, v=``): the first whose output is
attention's output (batch, length, width) is taken, and said. Where none is, the one line names
what each tried form did.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

from conformance.inference.names.convention import ForwardConvention
from conformance.inference.plan import CALL_REMEDY, InferenceError, Plan, first_call
from conformance.model.remedies import Note
from conformance.model.spec import Config
from conformance.subject.output_shape import output_problem

FORMS = (
    ("self", ("x",), False), ("qkv", ("query", "key", "value"), False),
    ("self", ("x",), True), ("self", ("hidden_states",), True),
    ("qkv", ("query", "key", "value"), True), ("qkv", ("q", "k", "v"), True),
)
"""(call, input names, by keyword), in the order tried."""


def variadic(forward) -> bool:
    """Whether ``forward`` takes ``*args`` or ``**kwargs``."""
    return any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in inspect.signature(forward).parameters.values())


def _described(call: str, inputs: tuple[str, ...], by_keyword: bool) -> str:
    shown = ", ".join(f"{name}=..." for name in inputs) if by_keyword else ", ".join(inputs)
    return f"forward({shown})"


def settle_by_trial(plan: Plan, label: str) -> tuple[ForwardConvention, Note]:
    """The convention a variadic forward works with (see the module docstring), with a note;
    InferenceError where no form gives attention's output."""
    config = Config(batch=2, q_len=5, kv_len=5, d_model=8,
                    num_heads=2 if plan.roles.heads else 1)
    tried = []
    for call, inputs, by_keyword in FORMS:
        convention = replace(plan.convention, call=call, inputs=inputs, by_keyword=by_keyword,
                             call_guessed=False)
        try:
            output = first_call(replace(plan, convention=convention), config)
        except Exception as error:  # this form is not the module's: the next one
            tried.append(f"{_described(call, inputs, by_keyword)} raised "
                         f"{type(error).__name__}")
            continue
        output = output[0] if isinstance(output, tuple) and output else output
        problem = output_problem(output, (config.batch, config.q_len, config.d_model))
        if problem is None:
            return convention, Note(f"forward takes *args/**kwargs: called as "
                                    f"{_described(call, inputs, by_keyword)} (tried: it "
                                    "returns attention's output)", CALL_REMEDY)
        tried.append(f"{_described(call, inputs, by_keyword)} returned {problem.reason}")
    raise InferenceError(f"{label}: forward takes *args/**kwargs and no call form gives "
                         f"attention's output ({'; '.join(tried)})", CALL_REMEDY)
