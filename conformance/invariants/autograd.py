"""Autograd: gradients exist, are right, and never reach masked keys.

Property: backward runs; every parameter receives a gradient and every gradient is finite; the
query and value inputs (and the key input where a row has two keys to weigh) receive a non-zero
gradient; ``torch.autograd.gradcheck`` passes in float64 on tiny shapes; and key/value inputs at
masked positions receive exactly zero gradient (for self-attention: with no gradient flowing into
the masked positions' own rows).
"""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from conformance.cases import Case
from conformance.invariants.base import Check, CheckContext, Violation, fmt
from conformance.strategies import cases
from conformance.tolerance import worst_index


@st.composite
def _tiny(draw, context: CheckContext) -> Case:
    return draw(cases(context.capabilities, context.device, dtypes=(torch.float64,), max_len=3,
                      max_batch=2, max_heads=2, max_head_dim=2,
                      masks="auto"))


class Autograd(Check):
    """Backward runs; gradients reach every parameter and input, pass gradcheck, skip masked keys."""

    name = "autograd"
    title = "gradients reach every parameter; gradcheck passes; masked keys get exactly zero"

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        # Every row has a key to attend to: fully masked rows are the fully_masked check's.
        strategy = cases(caps, context.device,
                         masks="partly_masked" if caps.mask is not None else "none").filter(
            lambda case: bool(case.attendable_rows().all()))
        context.explore(strategy, lambda case: self.verify(context, case))
        if torch.float64 in caps.dtypes:
            context.explore(_tiny(context).filter(lambda case: bool(case.attendable_rows().all())),
                            lambda case: self.gradcheck(context, case), max_examples=5)

    def verify(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        keep = inputs.keep
        rows = case.attendable_rows()
        if inputs.is_self and keep is not None:
            rows = rows & keep.cpu()  # a masked position's own row would carry gradient to it
        shape = (case.batch, case.q_len, case.d_model)
        cotangent = torch.where(rows.to(inputs.query.device)[:, :, None],
                                case.tensor(*shape, stream=71), 0.0)
        gradients = instance.gradients(inputs, cotangent)

        for name, gradient in gradients.parameters.items():
            if gradient is None:
                raise Violation(f"parameter {name} receives no gradient",
                                hint="is a projection detached (.detach(), torch.no_grad()) or "
                                     "not used at all?")
            if not bool(torch.isfinite(gradient).all()):
                raise Violation(f"the gradient of parameter {name} is not finite")
        for name, gradient in gradients.inputs.items():
            if not bool(torch.isfinite(gradient).all()):
                raise Violation(f"the gradient with respect to input {name} is not finite")

        # With one key to attend to the softmax weight is 1 whatever q and k are: their gradient
        # is legitimately zero. The values (and x) always matter.
        weighing = int(case.kv_len if keep is None else keep.sum(-1).max()) >= 2
        needed = [n for n in gradients.inputs if n not in ("query", "key") or weighing]
        for name in needed:
            if float(gradients.inputs[name].abs().max()) == 0.0 and bool(rows.any()):
                raise Violation(f"no gradient reaches input {name}",
                                hint="is that input detached, or not used?")

        if keep is None:
            return
        masked = (~keep).cpu()[:, :, None]
        for name in ("key", "value", "x"):
            if name not in gradients.inputs:
                continue
            leak = torch.where(masked, gradients.inputs[name].abs().to(torch.float64).cpu(), 0.0)
            if float(leak.max()) != 0.0:
                b, position, _ = worst_index(leak)
                raise Violation(
                    f"input {name} at masked position {position} of batch {b} receives gradient "
                    f"{fmt(float(leak[b, position].max()))}, not exactly 0",
                    hint="is the mask applied after the softmax, or with a finite fill that "
                         "lets a little weight through?")

    def gradcheck(self, context: CheckContext, case: Case) -> None:
        problem = context.build(case).gradcheck(case.inputs(context.capabilities.call))
        if problem is not None:
            raise Violation(f"torch.autograd.gradcheck fails in float64: {problem}",
                            hint="a custom backward, an in-place op or a detach in the graph?")
