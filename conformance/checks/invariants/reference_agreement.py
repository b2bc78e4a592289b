"""Reference agreement: output and input gradients match the float64 reference.

Property: the output, and the gradient of ``sum(output * c)`` with respect to every input for a
random cotangent ``c``, agree with the float64 reference computed from the implementation's own
weights: max error <= K_MAX x the max error of the suite's plain attention in the same dtype
+ the dtype's floor, and mean error <= K_MEAN x that baseline's mean error + a tenth of the floor
(see :mod:`conformance.numerics.tolerance`), in every dtype it runs in: a half-precision kernel's
hand-written backward is judged against what half precision can do on that very example. Rows
with no key to attend to are the fully_masked check's. A gradient that disagrees is said to be no
derivative of the forward only where finite differences of the implementation's own forward, in
its own float32 or float64, disagree with its backward too.

Through the core, where no weight layout maps the layer or its position encoding is one the
reference does not model: each attention core its forward computes against the float64 softmax
of its own logits with the keys attention hides masked (see
:mod:`conformance.checks.invariants.core_reference`).
"""

from __future__ import annotations

import torch

from conformance.checks.core_route import core_cases, require_core, weights_skip_reason
from conformance.checks.invariants.autograd import FD_STEP, finite_difference_problem
from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.core_reference import verify_core
from conformance.checks.invariants.likely_bug import expect_finite_or_mask_mistake, likely_bug
from conformance.checks.invariants.verify import (
    agree_with_reference,
    output_disagreement,
)
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases, wide_or_own_dtypes
from conformance.model.forms import PositionEncoding
from conformance.model.remedies import Option, Remedy
from conformance.model.results import Route
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import reference_attention
from conformance.numerics.tolerance import Agreement, agreement
from conformance.subject.boundary import Inputs, Instance


def reference_gradients(weights: HeadWeights, inputs: Inputs, cotangent: torch.Tensor, *,
                        causal: bool, dtype: torch.dtype, window: int | None = None, chunk: int | None = None,
                        encoding: PositionEncoding | None = None,
                        **options: object) -> dict[str, torch.Tensor]:
    """Input gradients of the reference computed in ``dtype``, keyed as Instance.gradients;
    ``options`` go to the reference as they are (a ``scale``, the keys ``allowed``)."""
    if inputs.is_self:
        x = inputs.query.detach().to(dtype).requires_grad_(True)
        leaves, (q, k, v) = {"x": x}, (x, x, x)
    elif inputs.shares_kv:
        leaves = {name: getattr(inputs, name).detach().to(dtype).requires_grad_(True)
                  for name in ("query", "key")}
        q, k, v = leaves["query"], leaves["key"], leaves["key"]
    else:
        leaves = {name: getattr(inputs, name).detach().to(dtype).requires_grad_(True)
                  for name in ("query", "key", "value")}
        q, k, v = leaves["query"], leaves["key"], leaves["value"]
    with torch.enable_grad():
        output = reference_attention(weights, q, k, v, keep=inputs.keep, causal=causal,
                                     dtype=dtype, window=window, chunk=chunk, encoding=encoding,
                                     start=inputs.position, **options).output
        (output * cotangent.to(dtype)).sum().backward()
    return {name: leaf.grad for name, leaf in leaves.items()}


def gradient_disagreement(instance: Instance, weights: HeadWeights, inputs: Inputs,
                          cotangent: torch.Tensor, dtype: torch.dtype,
                          **options: object) -> tuple[str, Agreement] | None:
    """The first input whose gradient of sum(output * cotangent) disagrees with the float64
    reference's under the baseline rule (the reference in ``dtype`` the baseline; ``options``
    to both, as :func:`reference_gradients` takes them), with its agreement; None where every
    one agrees."""
    actual = instance.gradients(inputs, cotangent).inputs
    expected = reference_gradients(weights, inputs, cotangent, dtype=torch.float64, **options)
    plain = reference_gradients(weights, inputs, cotangent, dtype=dtype, **options)
    for name, gradient in actual.items():
        seen = agreement(gradient, expected[name], plain[name], dtype)
        if not seen.ok:
            return name, seen
    return None


def gradient_words(name: str, seen: Agreement) -> str:
    """A gradient's disagreement with the reference's, in numbers and where."""
    b, position, feature = seen.worst
    return (f"the gradient with respect to {name} differs from the float64 reference's: "
            f"{seen.describe()}; largest at batch {b}, position {position}, feature {feature}")


class ReferenceAgreement(Check):
    """Output and input gradients agree with the float64 reference."""

    name = "reference"
    order = 70
    applies = "every implementation"
    title = "output and input gradients agree with the float64 reference (per-example tolerance)"

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        unmapped = weights_skip_reason(caps)
        if unmapped is not None:  # the reference through each core the forward computes
            require_core(context, unmapped)
            context.explore(core_cases(caps, context.device, masks="auto",
                                       causal=caps.causality.kind == "always",
                                       dtypes=wide_or_own_dtypes(caps)),
                            lambda case: verify_core(context, case))
            return
        context.route = Route.WEIGHTS
        context.explore(cases(caps, context.device,
                              masks="auto"),
                        lambda case: self.verify(context, case))
        context.doubt(caps.doubts.weights,
                      "behaviour can't tell a skipped projection from a spare layer",
                      Remedy((Option("weights", "q,k,v,o", "check that layer as the output "
                                                           "projection it was meant to be"),
                              Option("output_projection", "applied", "the same, by role"))))
        context.doubt(caps.doubts.variant,
                      "behaviour can't tell which variant was meant: it checked the module "
                      "against the encoding it applies",
                      Remedy((Option("rope", "PAIRING[:THETA[:FRACTION]]",
                                     "hold its RoPE to the one meant"),
                              Option("alibi", "standard", "hold its ALiBi to the paper's "
                                                          "slopes"))))
        context.doubt(caps.doubts.encoding,
                      "RoPE is defined on pairs of dimensions: a width where the module's "
                      "rotation is none of them is outside what it can be held to")

    def verify(self, context: CheckContext, case: Case) -> None:
        instance, inputs, output, rows = context.first_call(case)
        weights = instance.read_weights()
        expect_finite_or_mask_mistake(context, case, output, rows)
        dtype = context.judged(case.config.dtype)
        encoding = context.capabilities.position.encoding
        seen, reference = agree_with_reference(output, weights, inputs, case, rows, judged=dtype,
                                               encoding=encoding)
        if not seen.ok:
            violation = output_disagreement(seen, output, reference, against="float64 reference",
                                            reference="reference")
            violation.hint = context.hint(lambda: likely_bug(context, case, instance, inputs,
                                                             output, rows))
            raise violation
        if not bool(case.attendable_rows().all()) or context.capabilities.forward_only:
            return  # a fully masked row's gradient is the fully_masked check's business
        # Only the rows attention specifies count (not a padded query's).
        cotangent = torch.where(rows.to(output.device)[:, :, None],
                                case.tensor(*output.shape, stream=51), 0.0)
        found = gradient_disagreement(instance, weights, inputs, cotangent, dtype,
                                      causal=case.causal, window=case.window, chunk=case.chunk,
                                      encoding=encoding)
        if found is not None:
            name, seen = found
            raise Violation(gradient_words(name, seen),
                            hint=context.hint(lambda: self._not_derivative(
                                instance, inputs, case, dtype, name)))

    @staticmethod
    def _not_derivative(instance, inputs: Inputs, case: Case, dtype: torch.dtype,
                        name: str) -> str | None:
        """Where the gradient of input ``name`` disagrees with finite differences of the
        implementation's own forward (in ``dtype``, moving that input alone), that in words;
        else None: the forward is then off by less than its output's tolerance, and nothing
        measured names a cause. None in half precision, where finite differences are noise."""
        if dtype not in FD_STEP:
            return None
        problem = finite_difference_problem(instance, inputs, case, dtype, only=name)
        if problem is None:
            return None
        return (f"the backward is not the forward's derivative ({problem}): a custom backward, "
                "an in-place op or a detach in the graph? (in a hand-written one: the softmax "
                "Jacobian's row-sum term, the scale, the normalisation)")
