"""The gate: the basic contract, checked first so a broken one is reported once.

Property: the implementation constructs for a small configuration, and its forward returns a
tensor of shape (batch, q_len, d_model) in the input's dtype and on its device, for every
declared dtype, with a mask where one is declared, with kv_len != q_len where cross-attention is
declared, with causality switched on where it is optional; declared weight access reads the
canonical shapes and writing them back changes nothing.

A failing basic call (first declared dtype, no mask) blocks every other check. A failing
declared feature is reported here, and the other checks run without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from conformance.adapter import ImplementationError
from conformance.cases import Case, dtype_name
from conformance.invariants.base import CheckContext, Violation, expect_output
from conformance.spec import Capabilities


@dataclass
class GateOutcome:
    """What the gate found: problems in words, the capabilities the other checks may rely on."""

    effective: Capabilities
    blocked: bool = False
    problems: list[str] = field(default_factory=list)


def _base_case(caps: Capabilities, dtype: torch.dtype, device: str, **changes) -> Case:
    heads = caps.heads or 2
    case = Case(batch=2, q_len=5, kv_len=5, num_heads=heads, head_dim=4,
                dtype=dtype_name(dtype), device=device, seed=0)
    if caps.max_len is not None:
        case = replace(case, q_len=min(5, caps.max_len), kv_len=min(5, caps.max_len))
    return replace(case, **changes)


def _try_call(context: CheckContext, case: Case) -> str | None:
    """Build and call once; the problem in words, or None."""
    try:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        output = instance.forward(inputs)
        expect_output(output, case, inputs)
    except (ImplementationError, Violation) as error:
        return str(error)
    return None


def _weights_problem(context: CheckContext, case: Case) -> str | None:
    try:
        instance = context.build(case)
        weights = instance.read_weights()
        expected = (case.num_heads, case.head_dim, case.d_model)
        if tuple(weights.w_q.shape) != expected or tuple(weights.w_k.shape) != expected:
            return (f"weights read as w_q {tuple(weights.w_q.shape)}, expected (heads, head_dim, "
                    f"d_in) = {expected}")
        inputs = case.inputs(context.capabilities.call)
        before = instance.forward(inputs)
        instance.write_weights(weights)
        after = instance.forward(inputs)
        if not torch.allclose(before, after, rtol=0.0, atol=0.0, equal_nan=True):
            return "writing the weights it read back changed the output"
    except ImplementationError as error:
        return str(error)
    return None


class Gate:
    """Constructs; forward returns the right shape, dtype and device for each declared feature."""

    name = "gate"
    title = "constructs; forward runs; output shape, dtype and device right"

    def evaluate(self, context: CheckContext) -> GateOutcome:
        caps = context.capabilities
        outcome = GateOutcome(effective=caps)
        first, *others = caps.dtypes
        problem = _try_call(context, _base_case(caps, first, context.device))
        if problem is not None:
            outcome.blocked = True
            outcome.problems.append(f"basic call ({dtype_name(first)}, no mask): {problem}")
            return outcome

        batch_eq_len = _base_case(caps, first, context.device, batch=3, q_len=3, kv_len=3)
        problem = _try_call(context, batch_eq_len)
        if problem is not None:
            outcome.problems.append(f"batch == length (3 x 3): {problem}")

        kept_dtypes = [first]
        for dtype in others:
            problem = _try_call(context, _base_case(caps, dtype, context.device))
            if problem is None:
                kept_dtypes.append(dtype)
            else:
                outcome.problems.append(f"declared dtype {dtype_name(dtype)}: {problem}")
        effective = replace(caps, dtypes=tuple(kept_dtypes))

        if caps.mask is not None:
            problem = _try_call(context, _base_case(caps, first, context.device, kept=(3, 5)))
            if problem is not None:
                outcome.problems.append(f"declared mask ({caps.mask.describe()}): {problem}")
                effective = replace(effective, mask=None)
        if caps.cross_attention:
            problem = _try_call(context, _base_case(caps, first, context.device, kv_len=3))
            if problem is not None:
                outcome.problems.append(f"declared cross-attention (kv_len 3 != q_len 5): {problem}")
                effective = replace(effective, cross_attention=False)
        if caps.causal == "optional":
            problem = _try_call(context, _base_case(caps, first, context.device, causal=True))
            if problem is not None:
                outcome.problems.append(f"declared {caps.causal_argument}=True: {problem}")
                effective = replace(effective, causal="never")
        if caps.weights:
            problem = _weights_problem(context, _base_case(caps, first, context.device))
            if problem is not None:
                outcome.problems.append(f"declared weight access: {problem}")
                effective = replace(effective, weights=False)
        outcome.effective = effective
        return outcome
