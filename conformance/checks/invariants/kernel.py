"""Kernel: a kernel function keeps attention's contract through its own arguments.

Property (a core function, ``Capabilities.kernel``; in each dtype it runs in, by the baseline
rule, the output and the gradients with respect to every input): with ``causal=True`` and fewer
queries than keys (decode's single query included), attention over the keys the measured
alignment allows, query i seeing keys j <= i + Lk - Lq (bottom-right) or j <= i (top-left); and
with an explicit softmax scale s (half and twice the default), softmax(s q k^T) v. A scale the
kernel ignores (its output is still the default scale's) is said so. A kernel whose causal
alignment is neither is compared with bottom-right, the alignment of FlashAttention >= 2.1 and
SDPA's lower-right.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.reference_agreement import reference_gradients
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case, dtype_name
from conformance.generation.strategies import cases
from conformance.model.forms import CausalAlignment
from conformance.model.spec import Capabilities
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import allowed_keys, reference_attention
from conformance.numerics.tolerance import Agreement, agreement
from conformance.subject.boundary import Inputs, Instance

SCALE_FACTORS = (0.5, 2.0)
"""The explicit scales given, as multiples of the default 1/sqrt(head_dim)."""

DECODE = dict(batch=2, q_len=1, kv_len=5, num_heads=2, head_dim=4)
"""Decode's shape: one query over the keys so far."""
BLOCKS = dict(batch=1, q_len=3, kv_len=37, num_heads=2, head_dim=8)
"""Keys over several of a kernel's blocks (16, 32 keys), the last one partial."""


class Kernel(Check):
    """Causal with fewer queries than keys, at its alignment; an explicit scale is applied."""

    name = "kernel"
    title = "a kernel's arguments: causal with fewer queries than keys; an explicit softmax scale"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        kernel = capabilities.kernel
        if kernel is None:
            return "not a kernel function"
        if kernel.alignment is None and kernel.scale_argument is None:
            return "takes neither causal=True with fewer queries than keys nor a softmax scale"
        if not capabilities.weights:
            return "needs canonical weight access to build the reference"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        first = caps.dtypes[0]
        # Decode first: hypothesis tries the explicit examples last-applied first.
        examples = [Case(**shape, dtype=dtype_name(first), seed=0, device=context.device)
                    for shape in (BLOCKS, DECODE)]
        strategy = cases(caps, context.device, masks="none").filter(
            lambda case: case.kv_len >= 2 and case.q_len <= case.kv_len)
        context.explore(strategy, lambda case: self.verify(context, case), examples=examples)

    def verify(self, context: CheckContext, case: Case) -> None:
        kernel = context.capabilities.kernel
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        weights = instance.read_weights()
        if kernel.alignment is not None:
            alignment = kernel.alignment
            aligned = (CausalAlignment.BOTTOM_RIGHT if alignment is CausalAlignment.NEITHER
                       else alignment)
            allowed = allowed_keys(case.batch, case.q_len, case.kv_len, None, True,
                                   offset=aligned.offset(case.q_len, case.kv_len))
            words = (f"causal=True and {case.q_len} quer{'y' if case.q_len == 1 else 'ies'} "
                     f"over {case.kv_len} keys (aligned {aligned.value.replace('_', '-')}; "
                     + ("it measured as neither)" if alignment is CausalAlignment.NEITHER
                        else "as measured)"))
            self._agree(context, case, instance, replace(inputs, causal=True), weights,
                        words, allowed=allowed)
        if kernel.scale_argument is not None:
            default = 1 / math.sqrt(case.head_dim)
            for factor in SCALE_FACTORS:
                scale = factor * default
                given = replace(inputs, options=((kernel.scale_argument, scale),))
                words = f"{kernel.scale_argument}={scale:.4g}"
                self._agree(context, case, instance, given, weights, words, scale=scale,
                            ignored=default)

    def _agree(self, context: CheckContext, case: Case, instance: Instance, inputs: Inputs,
               weights: HeadWeights, words: str, *, ignored: float | None = None,
               **options: object) -> None:
        """Output and input gradients of ``inputs`` against the reference with ``options``;
        ``ignored``: the scale a kernel that ignores the given one computes with."""
        dtype = context.judged(case.config.dtype)
        output = context.run(instance, inputs, case)
        seen, _ = self._seen(output, weights, inputs, dtype, **options)
        if not seen.ok:
            b, row, feature = seen.worst
            hint = None
            if ignored is not None and self._seen(output, weights, inputs, dtype,
                                                  scale=ignored)[0].ok:
                hint = (f"the output is the default scale's (1/sqrt({case.head_dim})): "
                        f"{words.partition('=')[0]} is ignored")
            raise Violation(f"with {words}, the output differs from the float64 reference: "
                            f"{seen.describe()}; largest at batch {b}, row {row}, feature "
                            f"{feature}", hint=hint)
        cotangent = case.tensor(*output.shape, stream=61)
        actual = instance.gradients(inputs, cotangent).inputs
        expected = reference_gradients(weights, inputs, cotangent, causal=False,
                                       dtype=torch.float64, **options)
        plain = reference_gradients(weights, inputs, cotangent, causal=False, dtype=dtype,
                                    **options)
        for name, gradient in actual.items():
            seen = agreement(gradient, expected[name], plain[name], dtype)
            if not seen.ok:
                b, position, feature = seen.worst
                raise Violation(
                    f"with {words}, the gradient with respect to {name} differs from the float64 "
                    f"reference's: {seen.describe()}; largest at batch {b}, position {position}, "
                    f"feature {feature}",
                    details=[f"same-dtype baseline error {fmt(seen.baseline_error)}"])

    @staticmethod
    def _seen(output: torch.Tensor, weights: HeadWeights, inputs: Inputs, dtype: torch.dtype,
              **options: object) -> tuple[Agreement, torch.Tensor]:
        def attention(in_dtype: torch.dtype, first: bool = True) -> torch.Tensor:
            return reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                       dtype=in_dtype, scale_first=first, **options).output

        expected = attention(torch.float64)
        return agreement(output, expected, [attention(dtype), attention(dtype, False)],
                         dtype), expected
