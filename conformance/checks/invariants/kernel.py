"""Kernel: a kernel function keeps attention's contract through its own arguments.

Property (a core function, ``Capabilities.kernel``; in each dtype it runs in, by the baseline
rule, the output and the gradients with respect to every input), each where it takes the
argument:

- ``causal=True`` with fewer queries than keys (decode's single query included): attention over
  the keys its alignment allows (declared, or else measured), query i seeing keys
  j <= i + Lk - Lq (bottom-right) or j <= i (top-left). A kernel whose alignment measures as
  neither is compared with bottom-right, the alignment of FlashAttention >= 2.1 and SDPA's
  lower-right; one declared and computing the other fails.
- an explicit softmax scale s (half and twice the default): softmax(s q k^T) v. A scale the
  kernel ignores (its output is still the default scale's) is said so.
- ``window_size=(left, right)`` ((2, 0) and (1, 2)): query i sees keys i + o - left ..
  i + o + right, o the alignment's offset (0 with as many queries as keys).
- a softcap c = 1: logits c tanh(s / c), capped before the mask (causal where it takes causal).
- ALiBi slopes (the paper's, one per head) through its own keyword: logits s q_i . k_j -
  m_h |i - j| (FlashAttention's symmetric bias), with as many queries as keys, causal where it
  takes causal.
- an explicit scale (twice the default) together with each other argument it takes (causal
  with fewer queries than keys, a window, a softcap, ALiBi slopes): each argument's effect with
  the others present, so a scale dropped when a softcap is given is seen.
- the log-sum-exp it returns: logsumexp_j(s q_i . k_j) per (batch, head, query) in natural log,
  against the float64 reference's by the same rule; in base 2 it is a warning (a Triton kernel's
  exp2 arithmetic, which only its author can say is meant), any other value a failure.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.reference_agreement import (
    gradient_disagreement,
    gradient_words,
)
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import OtherKind, Violation
from conformance.generation.base_case import base_pair
from conformance.generation.cases import Case, dtype_name
from conformance.generation.strategies import cases
from conformance.model.forms import (
    ALIBI_OPTION,
    LSE_OPTION,
    AlibiBias,
    CausalAlignment,
    KernelArguments,
    PositionEncoding,
)
from conformance.model.spec import Capabilities
from conformance.model.weights import HeadWeights
from conformance.numerics.reference import allowed_keys, reference_attention
from conformance.numerics.tolerance import Agreement, abs_error, agreement
from conformance.subject.boundary import Inputs, Instance

WINDOWS = ((2, 0), (1, 2))
"""The windows given, (left, right) keys around each query's diagonal."""
SOFTCAP = 1.0
"""The cap given: logits of the generated sizes (~1) are bent well away from themselves."""
SCALE_FACTORS = (0.5, 2.0)
"""The explicit scales given, as multiples of the default 1/sqrt(head_dim)."""

DECODE = dict(batch=2, q_len=1, kv_len=5)
"""Decode's shape: one query over the keys so far."""
BLOCKS = dict(batch=1, q_len=3, kv_len=37)
"""Keys over several of a kernel's blocks (16, 32 keys), the last one partial."""


class KernelCheck(Check):
    """A kernel's own arguments do what FlashAttention's do."""

    name = "kernel"
    order = 260
    applies = "a kernel function f(q, k, v, ...)"
    title = ("a kernel's arguments: causal with fewer queries than keys, softmax_scale, "
             "window_size, softcap, alibi_slopes, the lse it returns")

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        kernel = capabilities.kernel
        if kernel is None:
            return OtherKind("not a kernel function")
        if replace(kernel, varlen=False) == KernelArguments():
            return ("takes no argument it checks (causal=True, a softmax scale, a window, a "
                    "softcap, ALiBi slopes, a log-sum-exp returned)")
        if not capabilities.weights:
            return "needs canonical weight access to build the reference"
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        first = caps.floats.supported[0]
        # At a configuration it builds (a kernel may take head_dim in multiples of 8 only).
        heads, head_dim = base_pair(caps)
        # Decode first: hypothesis tries the explicit examples last-applied first.
        examples = [Case(**shape, num_heads=heads, head_dim=head_dim, dtype=dtype_name(first),
                         seed=0, device=context.device) for shape in (BLOCKS, DECODE)]
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
                        else "as stated)"))
            self._agree(context, case, instance, replace(inputs, causal=True), weights,
                        words, allowed=allowed)
        offset = self._offset(kernel.alignment, case)
        if kernel.window_argument is not None and offset is not None:
            for window in WINDOWS:
                self._agree(context, case, instance,
                            replace(inputs, options=((kernel.window_argument, window),)),
                            weights, f"{kernel.window_argument}={window}",
                            allowed=window_keys(case.q_len, case.kv_len, window, offset))
        if kernel.softcap_argument is not None:
            causal = kernel.alignment is not None
            allowed = (allowed_keys(case.batch, case.q_len, case.kv_len, None, True,
                                    offset=offset) if causal and offset is not None else None)
            if not causal or allowed is not None:
                words = f"{kernel.softcap_argument}={SOFTCAP:g}" + (" and causal=True" if causal
                                                                     else "")
                self._agree(context, case, instance,
                            replace(inputs, causal=causal,
                                    options=((kernel.softcap_argument, SOFTCAP),)),
                            weights, words, softcap=SOFTCAP, allowed=allowed)
        if kernel.lse_argument is not None:
            self._lse(context, case, instance, inputs, weights)
        if kernel.alibi_argument is not None and case.q_len == case.kv_len:
            causal = kernel.alignment is not None
            self._agree(context, case, instance,
                        replace(inputs, causal=causal,
                                options=((ALIBI_OPTION, kernel.alibi_argument),)),
                        weights, f"{kernel.alibi_argument}=the paper's slopes"
                        + (" and causal=True" if causal else ""),
                        encoding=PositionEncoding(alibi=AlibiBias(symmetric=True)),
                        causal=causal)
        if kernel.scale_argument is not None:
            default = 1 / math.sqrt(case.head_dim)
            for factor in SCALE_FACTORS:
                scale = factor * default
                given = replace(inputs, options=((kernel.scale_argument, scale),))
                words = f"{kernel.scale_argument}={scale:.4g}"
                self._agree(context, case, instance, given, weights, words, scale=scale,
                            ignored=default)
            scale = SCALE_FACTORS[-1] * default
            for words, causal, extra, options in self._others(kernel, case, offset):
                given = replace(inputs, causal=causal, options=(
                    (kernel.scale_argument, scale), *extra))
                self._agree(context, case, instance, given, weights,
                            f"{kernel.scale_argument}={scale:.4g} and {words}", scale=scale,
                            ignored=default, **options)

    @staticmethod
    def _others(kernel: KernelArguments, case: Case, offset: int | None
                ) -> list[tuple[str, bool, tuple, dict[str, object]]]:
        """The kernel's other arguments as (words, causal, its options, the reference's), each
        applicable at ``case``: what an explicit scale is checked together with."""
        found = []
        causal = kernel.alignment is not None
        allowed = (allowed_keys(case.batch, case.q_len, case.kv_len, None, True, offset=offset)
                   if causal and offset is not None else None)
        if allowed is not None and case.q_len < case.kv_len:
            found.append((f"causal=True over {case.kv_len} keys", True, (), dict(allowed=allowed)))
        if kernel.window_argument is not None and offset is not None:
            window = WINDOWS[0]
            found.append((f"{kernel.window_argument}={window}", False,
                          ((kernel.window_argument, window),),
                          dict(allowed=window_keys(case.q_len, case.kv_len, window, offset))))
        if kernel.softcap_argument is not None and (not causal or allowed is not None):
            found.append((f"{kernel.softcap_argument}={SOFTCAP:g}", causal,
                          ((kernel.softcap_argument, SOFTCAP),),
                          dict(softcap=SOFTCAP, allowed=allowed)))
        if kernel.alibi_argument is not None and case.q_len == case.kv_len:
            found.append((f"{kernel.alibi_argument}=the paper's slopes", causal,
                          ((ALIBI_OPTION, kernel.alibi_argument),),
                          dict(encoding=PositionEncoding(alibi=AlibiBias(symmetric=True)),
                               causal=causal)))
        return found

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
                                                  **{**options, "scale": ignored})[0].ok:
                others = words.partition(" and ")[2]
                hint = (f"the output is the default scale's (1/sqrt({case.head_dim})): "
                        f"{words.partition('=')[0]} is ignored"
                        + (f" when {others.partition('=')[0]} is given" if others else ""))
            raise Violation(f"with {words}, the output differs from the float64 reference: "
                            f"{seen.describe()}; largest at batch {b}, row {row}, feature "
                            f"{feature}", hint=hint)
        if context.capabilities.forward_only:
            return
        found = gradient_disagreement(instance, weights, inputs,
                                      case.tensor(*output.shape, stream=61), dtype,
                                      **{"causal": False, **options})
        if found is not None:
            name, seen = found
            raise Violation(f"with {words}, {gradient_words(name, seen)}",
                            details=[f"same-dtype baseline error {fmt(seen.baseline_error)}"])

    @staticmethod
    def _offset(alignment: CausalAlignment | None, case: Case) -> int | None:
        """How far past its own index query i's diagonal lies: 0 with as many queries as keys,
        else the measured alignment's offset; None where no alignment was measured."""
        if case.q_len == case.kv_len:
            return 0
        if alignment in (CausalAlignment.BOTTOM_RIGHT, CausalAlignment.TOP_LEFT):
            return alignment.offset(case.q_len, case.kv_len)
        return None

    def _lse(self, context: CheckContext, case: Case, instance: Instance, inputs: Inputs,
             weights: HeadWeights) -> None:
        """The returned log-sum-exp against the float64 reference's, natural log."""
        dtype = context.judged(case.config.dtype)
        asked = replace(inputs, options=((LSE_OPTION, context.capabilities.kernel.lse_argument),))
        lse = instance.forward(asked)
        shape = (case.batch, case.q_len, case.num_heads)
        if tuple(lse.shape) != shape:
            raise Violation(f"the log-sum-exp returned has shape {tuple(lse.shape)} once "
                            f"read as (batch, q_len, heads), expected {shape}")

        def reference(in_dtype: torch.dtype, first: bool = True, **options) -> torch.Tensor:
            return reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                       dtype=in_dtype, scale_first=first,
                                       **options).lse.transpose(1, 2)

        expected = reference(torch.float64)
        baselines = [reference(dtype), reference(dtype, False)]
        seen = agreement(lse, expected, baselines, dtype)
        if seen.ok:
            return
        b, row, head = seen.worst
        numbers = (f"batch {b}, head {head}, query {row}: {fmt(float(lse[b, row, head]))}, "
                   f"reference {fmt(float(expected[b, row, head]))}")
        if agreement(lse * math.log(2), expected, baselines, dtype).ok:
            raise Violation(f"the log-sum-exp returned is in base 2 ({numbers}, times ln 2 it "
                            "agrees): natural log is what FlashAttention and SDPA return",
                            hint="exp2 arithmetic (a Triton kernel's): if base 2 is meant, say "
                                 "so to its users; this is a warning", severity="warn")
        raise Violation(f"the log-sum-exp returned differs from the float64 reference's "
                        f"logsumexp_j(s q_i . k_j): {seen.describe()}; largest at {numbers}",
                        hint=context.hint(lambda: self._lse_mistake(
                            lse, seen.allowed, weights, inputs, reference)))

    @staticmethod
    def _lse_mistake(lse: torch.Tensor, allowed: float, weights: HeadWeights, inputs: Inputs,
                     reference) -> str | None:
        """The known mistake the returned log-sum-exp agrees with (within the ``allowed`` error
        of the comparison with the truth), where one does: the row's max m with the base-2 log
        of its sum (m + log2 sum_j e^(s_j - m)), or the logits unscaled."""
        result = reference_attention(weights, inputs.query, inputs.key, inputs.value)
        natural = result.lse
        top = natural + result.attention.amax(-1).log()  # the row's largest logit, m
        mixed = (top + (natural - top) / math.log(2)).transpose(1, 2)
        for words, expected in (
                ("natural and base 2 mixed: the row's max plus the base-2 log of its sum (an "
                 "exp2 kernel half converted)", mixed),
                ("the log-sum-exp of the unscaled logits q.k: the softmax scale left out",
                 reference(torch.float64, scale=1.0))):
            if float(abs_error(lse, expected).max()) <= allowed:
                return words
        return None

    @staticmethod
    def _seen(output: torch.Tensor, weights: HeadWeights, inputs: Inputs, dtype: torch.dtype,
              **options: object) -> tuple[Agreement, torch.Tensor]:
        def attention(in_dtype: torch.dtype, first: bool = True) -> torch.Tensor:
            return reference_attention(weights, inputs.query, inputs.key, inputs.value,
                                       dtype=in_dtype, scale_first=first, **options).output

        expected = attention(torch.float64)
        return agreement(output, expected, [attention(dtype), attention(dtype, False)],
                         dtype), expected


def window_keys(q_len: int, kv_len: int, window: tuple[int, int], offset: int) -> torch.Tensor:
    """(1, 1, Lq, Lk) bool: the keys ``window_size=(left, right)`` lets each query see, its
    diagonal ``offset`` keys past its own index (-1: unbounded on that side)."""
    rows = torch.arange(q_len)[:, None] + offset
    cols = torch.arange(kv_len)[None, :]
    left, right = window
    seen = torch.ones(q_len, kv_len, dtype=torch.bool)
    if left >= 0:
        seen = seen & (cols >= rows - left)
    if right >= 0:
        seen = seen & (cols <= rows + right)
    return seen[None, None]
