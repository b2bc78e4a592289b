"""Low precision: float16 and bfloat16 work where declared, and agree with the reference.

Property: where float16 / bfloat16 is declared, forward runs in it (with and without the mask)
and returns that dtype, its rows with keys are finite, and (with weight access) it agrees with
the float64 reference under the tolerance rule (the baseline is the suite's plain attention in
the same dtype), over generated shapes and over a long sequence of LONG_KEYS keys, where error
that accumulates with the number of keys (running sums kept in half precision) shows. There
the inputs share a common component (offset by 1), so the output stays of order 1 instead of
shrinking like an average of independent values, and the dtype's floor doesn't hide the error.
A module with positions (RoPE, ALiBi, a position bias) also gets, in each half dtype, one case
just past the positions the dtype holds exactly (bfloat16: 256, float16: 2048), its inputs of
std POSITION_GAIN so that attention is sharp enough for a relative distance off by one to show:
there the baseline's RoPE angles are exact (no correct module's angles are the dtype's there),
and a position rounded in half precision (257 read as 256) fails.
A masking
value that overflows float16 (-1e9, -1e20) is reported as exactly that, with the exception text.
Findings in a dtype inference assumed (nobody declared it) are warnings.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.gate import LOW_PRECISION
from conformance.checks.invariants.verify import agree_with_reference, expect_finite_rows, reference_applies
from conformance.checks.invariants.violation import CheckFailed, Finding, Lacking, Violation
from conformance.generation.base_case import base_pair
from conformance.generation.cases import Case, dtype_name, own_queries
from conformance.generation.strategies import SEEDS, cases, fixed_features, window_padding
from conformance.model.spec import Capabilities
from conformance.numerics.position_encoding import exact_integers
from conformance.numerics.tolerance import K_MAX, abs_error, only_rows
from conformance.subject.boundary import ImplementationError

LONG_OFFSET = 1.0
"""Common component of the long case's inputs."""

PAST_EXACT = 8
"""Positions past the dtype's exact integers in the positions case (one example per dtype: the
float16 one has 2056 tokens, its cost bounded)."""

POSITION_GAIN = 3.0
"""Standard deviation of the positions case's inputs: attention sharp enough that keys one
position apart take different weights (a position rounded shows), in the normal range."""

POSITIONS_ROUNDED = ("the error grows along the positions (the first rows differ by at most "
                     "{early}, rows past {middle} by up to {late}): are RoPE's positions or "
                     "frequencies computed in the module's dtype (arange(L).type_as(inv_freq), "
                     "a frequency buffer cast with the model)? Past position {exact} the dtype "
                     "can't hold the positions at all ({first} is read as {exact}): build "
                     "positions and angles in float32")

LONG_KEYS = 512
"""Keys in the long-sequence case: enough that accumulating the softmax sum or the weighted
values in half precision costs several times the error of plain half-precision attention."""

OVERFLOW_WORDS = ("without overflow", "cannot be converted to type at::Half",
                  "cannot be converted to type at::BFloat16")


def overflow_hint(problem: str) -> str | None:
    if any(words in problem for words in OVERFLOW_WORDS):
        return ("the masking value overflows float16 (largest finite 65504): fill with "
                "torch.finfo(scores.dtype).min or float('-inf') instead of -1e9 / -1e20")
    return None


class LowPrecision(Check):
    """float16 / bfloat16 run where declared and agree with the reference."""

    name = "low_precision"
    order = 130
    applies = "float16 or bfloat16"
    title = "float16 / bfloat16 run where declared and agree with the reference"
    owns = tuple(dtype_name(d) for d in LOW_PRECISION)

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if not any(d in LOW_PRECISION for d in capabilities.floats.supported):
            return Lacking("no float16 or bfloat16")
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        assumed = {dtype_name(d) for d in caps.floats.assumed}
        broken = {feature: p for feature, p in context.broken.items()
                  if feature in {dtype_name(d) for d in LOW_PRECISION}}
        declared = [p for feature, p in broken.items() if feature not in assumed]
        if declared:
            raise CheckFailed(Violation(declared[0], details=declared[1:],
                                        hint=overflow_hint(declared[0])), None)
        for problem in broken.values():
            context.warnings.append(Finding(Violation(
                f"{problem} (a dtype inference assumed, nobody declared: a warning)",
                hint=overflow_hint(problem), severity="warn"), None))
        low = tuple(d for d in caps.floats.supported if d in LOW_PRECISION)
        if not low:  # every low-precision dtype broke at the gate (reported above)
            return
        context.explore(cases(caps, context.device, dtypes=low,
                              masks="auto"),
                        lambda case: self.verify(context, case))
        if caps.length_near(LONG_KEYS) < LONG_KEYS:
            context.observe(f"the {LONG_KEYS}-key case is not run: it takes "
                            + (f"{caps.length} tokens only" if caps.length is not None
                               else f"at most {caps.max_len} positions"))
            return
        for dtype in low:
            long_case = self.long_case(caps, context.device, dtype_name(dtype))
            context.explore(SEEDS.map(lambda seed, c=long_case: replace(c, seed=seed)),
                            lambda case: self.verify(context, case, offset=LONG_OFFSET),
                            max_examples=2)
        for dtype in low if caps.position.positional else ():
            length = exact_integers(dtype) + PAST_EXACT
            if caps.max_len is not None and caps.max_len < length:
                continue
            past = own_queries(replace(self.long_case(caps, context.device, dtype_name(dtype)),
                                       batch=1, q_len=length, kv_len=length, kept=None), caps)
            context.explore(SEEDS.map(lambda seed, c=past: replace(c, seed=seed)),
                            lambda case: self.verify(context, case, gain=POSITION_GAIN),
                            max_examples=1)

    @staticmethod
    def long_case(caps: Capabilities, device: str, dtype: str) -> Case:
        """A sequence of LONG_KEYS keys: queries few where kv_len may differ (cross-attention),
        else as many; every key kept, or some padding masked where a mask is declared."""
        heads, _ = base_pair(caps)
        head_dims = sorted(d for h, d in caps.shapes or () if h == heads) or [16]
        head_dim = min(head_dims, key=lambda d: abs(d - 16))
        q_len = 8 if caps.cross_attention and caps.causality.kind == "never" else LONG_KEYS
        keep = None if caps.mask is None else (LONG_KEYS - 37,)
        case = Case(batch=1, q_len=q_len, kv_len=LONG_KEYS, num_heads=heads, head_dim=head_dim,
                    dtype=dtype, device=device, kept=keep, causal=caps.causality.kind == "always",
                    **fixed_features(caps))
        if (case.window is not None or case.chunk is not None) and keep is not None:
            case = window_padding(case)  # every row keeps a key in its window and chunk
        return own_queries(case, caps)

    def verify(self, context: CheckContext, case: Case, offset: float = 0.0,
               gain: float = 1.0) -> None:
        details = []
        if offset:
            details = [f"the long-sequence case: inputs offset by {offset:g} (a component "
                       f"common to every position), {case.kv_len} keys"]
        if gain != 1.0:
            details = [f"the positions case: {case.kv_len} tokens, past the {case.dtype} "
                       f"positions held exactly, inputs of std {gain:g}"]
        instance, inputs, output, rows = self._call(context, case, offset, gain)
        expect_finite_rows(output, rows)
        if not reference_applies(context.capabilities):
            return
        # Past the dtype's exact positions, RoPE's angles are exact in every baseline.
        past = case.kv_len > exact_integers(case.config.dtype)
        seen, reference = agree_with_reference(output, instance.read_weights(), inputs, case,
                                               rows, judged=context.judged(case.config.dtype),
                                               encoding=context.capabilities.position.encoding,
                                               dtype_tables=not past)
        if not seen.ok:
            b, row, _ = seen.worst
            raise Violation(f"in {case.dtype} the output differs from the float64 reference: "
                            f"{seen.describe()} (row {row} of batch {b})", details=details,
                            hint=context.hint(lambda: self._rounded_positions(
                                case, output, reference, rows)
                                or self._cause(context, case, offset)))

    @staticmethod
    def _rounded_positions(case: Case, output: torch.Tensor, reference: torch.Tensor,
                           rows: torch.Tensor) -> str | None:
        """POSITIONS_ROUNDED where, in a case past the dtype's exact positions, the later half
        of the rows is off several times more than the first eighth."""
        exact = exact_integers(case.config.dtype)
        if case.q_len <= exact + 1:
            return None
        error = only_rows(abs_error(output, reference).cpu(), rows).amax(dim=(0, 2))
        middle = case.q_len // 2
        early, late = float(error[: max(1, case.q_len // 8)].max()), float(error[middle:].max())
        if late <= K_MAX * early:
            return None
        return POSITIONS_ROUNDED.format(exact=exact, first=exact + 1, early=f"{early:.3g}",
                                        middle=middle, late=f"{late:.3g}")

    @staticmethod
    def _call(context: CheckContext, case: Case, offset: float, gain: float = 1.0) -> tuple:
        """The first call on ``case``, its inputs times ``gain`` (the positions case) and offset
        by ``offset`` (the long case): (instance, inputs, output, rows)."""
        if not offset and gain == 1.0:
            return context.first_call(case)
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        inputs = inputs.with_tensors(*(t * gain + offset for t in (
            (inputs.query,) if inputs.is_self else (inputs.query, inputs.key, inputs.value))))
        return instance, inputs, context.run(instance, inputs, case), context.rows(case)

    def _cause(self, context: CheckContext, case: Case, offset: float) -> str | None:
        """Why ``case`` disagrees in half precision, where measured: the same case in a wider
        declared dtype agrees with the reference (the error is the low precision's: for the
        long case, error that grows with the keys), or does not (the bug is not precision's);
        None when no wider dtype is declared."""
        wider = next((d for d in (torch.float32, torch.float64)
                      if d in context.capabilities.floats.supported), None)
        if wider is None:
            return None
        wide = replace(case, dtype=dtype_name(wider))
        try:
            instance, inputs, output, rows = self._call(context, wide, offset)
            expect_finite_rows(output, rows)
            seen, _ = agree_with_reference(output, instance.read_weights(), inputs, wide, rows,
                                           judged=context.judged(wider),
                                           encoding=context.capabilities.position.encoding)
        except (Violation, ImplementationError):
            seen = None
        if seen is None or not seen.ok:
            return (f"the same case in {wide.dtype} differs from the reference too: the error is "
                    "not one of precision (see reference)")
        if offset:
            return (f"the same case in {wide.dtype} agrees with the reference, and the short "
                    f"cases in {case.dtype} do: error that grows with the number of keys. Are "
                    "running sums (the softmax denominator, the output accumulator) kept in half "
                    "precision?")
        return (f"the same case in {wide.dtype} agrees with the reference: the error is "
                f"{case.dtype}'s. Is a low-precision intermediate (logits, softmax sum) kept "
                "where the same-dtype baseline upcasts or scales first?")
