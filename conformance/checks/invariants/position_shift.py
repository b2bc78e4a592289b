"""Relative positions: shifting every position by the same offset leaves the output unchanged.

Property: for an implementation with a relative position encoding inside (RoPE rotates q_i and
k_j by angles proportional to i and j, so q_i . k_j depends on i - j alone; ALiBi adds
-m_h (i - j); a learned bias measured at the attention core as a function of j - i, T5's
buckets), the output for tokens at positions s .. s + L - 1 equals the output for the same
tokens at 0 .. L - 1, within the reordering tolerance plus what rounding a rotation angle costs
(8 eps (s + L) relative); in float32 and float64 (the property is about positions; half
precision is judged elsewhere). The shift goes through the declared position argument; without one,
through a mask: s masked tokens in front move every real token s positions on, and are invisible.
RoPE rotating q and k with different pairings (half-split against interleaved), or at
different positions, breaks it; so does an absolute encoding. RoPE is defined on pairs of
dimensions: at an odd head width what the unpaired dimension does is outside the contract, and a
change there is a warning (HuggingFace's layers run at head_dim 1, rotating nothing relative).
"""

from __future__ import annotations

import torch

from conformance.checks.invariants.base import Check, CheckContext
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import cases, wide_dtypes
from conformance.model.forms import CacheStyle
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import abs_error, eps, only_rows, reordering_tolerance, worst_index
from conformance.subject.boundary import Inputs

MAX_SHIFT = 9
ANGLE_ULPS = 8.0


def _through_positions(caps: Capabilities) -> bool:
    """Whether the position argument shifts positions alone (not a preallocated cache's start,
    which also reads whatever the cache holds before it)."""
    return bool(caps.position.argument) and not (caps.cache.style is CacheStyle.BUFFERS
                                         and caps.position.argument == caps.cache.argument)


def _through_mask(caps: Capabilities) -> bool:
    """Whether masked tokens in front can shift the real ones: any mask can (every batch element
    gets the same leading padding, so a mask shared over the batch does too)."""
    return caps.mask is not None


class PositionShift(Check):
    """Shifting every position by the same offset changes nothing."""

    name = "position_shift"
    order = 190
    applies = "a relative position encoding (RoPE, ALiBi)"
    title = "relative positions: shifting every position by the same offset changes nothing"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.position.relative is None:
            return Lacking("no relative position encoding (RoPE, ALiBi)")
        if not wide_dtypes(capabilities):
            return "run in float32 or float64, and it declares neither"
        if not (_through_positions(capabilities) or _through_mask(capabilities)):
            return ("no way to shift positions alone: it takes no position argument and no mask "
                    "(the positions declaration names one it has)")
        if not _through_positions(capabilities):
            return capabilities.fixed_length_skip("masked tokens in front of its sequence")
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        max_len = 33 if _through_positions(caps) else 33 - MAX_SHIFT
        context.explore(cases(caps, context.device, max_len=max_len, cross=False,
                              dtypes=(torch.float32, torch.float64)),
                        lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        caps = context.capabilities
        instance = context.build(case)
        inputs = case.inputs(caps.call, use_mask=False)
        shift = 1 + case.seed % MAX_SHIFT
        plain = context.run(instance, inputs, case)
        rows = context.rows(case)
        if _through_positions(caps):
            how = f"through {caps.position.argument}"
            shifted = context.run(instance, Inputs(
                inputs.query, inputs.key, inputs.value, causal=inputs.causal, position=shift),
                case)
        else:
            how = f"by {shift} masked tokens in front"
            shifted = self._padded(context, instance, inputs, case, shift)
        dtype = context.judged(case.config.dtype)
        allowed = reordering_tolerance(dtype, plain) + ANGLE_ULPS * eps(dtype) * (
            shift + case.q_len) * max(1.0, float(plain.abs().max()))
        diff = only_rows(abs_error(shifted, plain), rows)
        if float(diff.max()) <= allowed:
            return
        b, row, _ = worst_index(diff)
        encoding = {"rotary": "RoPE", "alibi": "ALiBi", "bias": "its position bias"}[caps.position.relative]
        unpaired = caps.position.relative == "rotary" and case.head_dim % 2 == 1
        raise Violation(
            f"shifting every position by {shift} ({how}) changed output row {row} of batch {b} "
            f"by {fmt(float(diff[b, row].max()))} (allowed {fmt(allowed)})"
            + (f"; at head_dim {case.head_dim}, odd: RoPE leaves a dimension unpaired there"
               if unpaired else ""),
            severity="warn" if unpaired else "fail",
            hint=(f"{encoding} makes attention depend on i - j only: are q and k rotated with "
                  "the same pairing (half-split vs interleaved) and the same positions?"
                  if caps.position.relative == "rotary" else
                  "ALiBi's bias is -m (i - j): does it use absolute positions somewhere?"
                  if caps.position.relative == "alibi" else
                  "its bias measured as a function of j - i: does it count positions from "
                  "somewhere the shift moves (the mask's padding, a cache)?"))

    @staticmethod
    def _padded(context: CheckContext, instance, inputs: Inputs, case: Case,
                shift: int) -> torch.Tensor:
        """The output rows of the real tokens, with ``shift`` masked tokens in front."""
        def padded(tensor: torch.Tensor, stream: int) -> torch.Tensor:
            front = case.tensor(tensor.shape[0], shift, tensor.shape[2], stream=stream)
            return torch.cat([front, tensor], dim=1)

        keep = torch.ones(case.batch, case.kv_len + shift, dtype=torch.bool,
                          device=inputs.query.device)
        keep[:, :shift] = False
        if inputs.is_self:
            longer = Inputs.self_attention(padded(inputs.query, 71), keep, inputs.causal)
        else:  # q_len == kv_len here: the queries move with the keys
            longer = Inputs(padded(inputs.query, 71), padded(inputs.key, 72),
                            padded(inputs.value, 73), keep, inputs.causal)
        output = instance.forward(longer)
        return output[:, -case.q_len:]
