"""Numerical stability: large logits stay finite and right; softmax ignores a shift per row.

Property: with the query projection scaled so the largest logit is about 1e4 (float32 and
float64; half the layer's own finite mask fill where it is smaller, as BERT's -10000: logits past
its own convention are outside its normal range), the output is finite and agrees with the
float64 reference; adding the same constant
to every logit of a row (a shared key bias u adds q_i . u to all of row i's logits, here about
1e3) leaves the output as the reference has it. Agreement uses the tolerance rule of
:mod:`conformance.numerics.tolerance`. Both are in the normal range of float32 and float64: the suite's
plain attention in either textbook order (scale q first, or scale the product) stays finite
there, so a failure is a failure.

Robustness beyond the normal range (a warning, never a failure unless ``strict``): where float16
is declared, queries and keys with a standard deviation of about 80, far outside normal
activations, give finite output that agrees with the reference. There q @ k^T itself overflows
float16 (65504), so the textbook order that multiplies before scaling gives inf and NaN too.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.diagnosis import form_hint
from conformance.checks.invariants.base import Check, CheckContext, Structure
from conformance.checks.invariants.verify import (
    agree_with_reference,
    expect_finite_rows,
    reference_skip_reason,
)
from conformance.checks.invariants.violation import Violation
from conformance.generation.base_case import base_case, base_pair
from conformance.generation.cases import Case
from conformance.generation.constraints import HEAD_COUNTS, HEAD_DIMS
from conformance.generation.strategies import cases, wide_dtypes
from conformance.model.core import CoreKind
from conformance.model.forms import PositionEncoding
from conformance.model.spec import Capabilities
from conformance.model.weights import HeadWeights
from conformance.numerics.position_encoding import encode
from conformance.subject.boundary import ImplementationError, Instance

LARGE_LOGIT = 1e4
ROW_SHIFT = 1e3
FLOAT16_STD = 80.0

HINT = "is exp taken without subtracting the row maximum (softmax written by hand)?"
FLOAT16_HINT = ("does q @ k^T overflow float16 (largest finite 65504) before the 1/sqrt(head_dim) "
                "scaling? Scale q first, or compute the logits in float32")


def _projections(weights: HeadWeights, inputs, case: Case,
                 encoding: PositionEncoding | None) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 per-head q and k (B, H, L, Dh) from the weights and inputs (rotated, where the
    module has RoPE)."""
    w = weights.expanded().map(lambda t: t.to(torch.float64).cpu())
    q = torch.einsum("bld,hed->bhle", inputs.query.to(torch.float64).cpu(), w.w_q) + w.b_q[
        None, :, None]
    k = torch.einsum("bld,hed->bhle", inputs.key.to(torch.float64).cpu(), w.w_k) + w.b_k[
        None, :, None]
    q, k, _ = encode(q, k, encoding, None, inputs.position)
    return q, k


FINITE_FILL = 1e6
"""A mask fill smaller than this in size is a convention of its own (BERT's -10000), which bounds
the logits its layer is meant for; finfo.min or -inf bound nothing."""


def own_fill(instance: Instance, inputs, case: Case) -> float | None:
    """The one finite value the layer gives every masked key's logit (observed at its core:
    the softmax's input, or an SDPA call's float mask), where it is under FINITE_FILL in size;
    None where there is no mask, no core, or no such value."""
    if inputs.keep is None:
        return None
    masked = ~inputs.keep.cpu().bool()  # (B, Lk)
    found: set[float] = set()
    for site in instance.observe(inputs).sites:
        shown = site.logits if site.kind is CoreKind.SOFTMAX else site.bias
        if shown is None or shown.shape[0] % case.batch:
            continue
        by_batch = shown.to(torch.float64).cpu().reshape(case.batch, -1, *shown.shape[-2:])
        values = by_batch.permute(0, 3, 1, 2)[masked]  # (masked keys, G/B, Lq)
        if values.numel():
            found.update(float(v) for v in values.unique())
    if len(found) != 1:
        return None
    (fill,) = found
    return fill if fill == fill and 0 < abs(fill) < FINITE_FILL else None


WIDEST_LENGTH = 16


def widest_case(caps: Capabilities, device: str) -> Case:
    """The float16 search's first example: the widest heads the module builds (at its base head
    count), 16 tokens. There q @ k^T of std-80 queries and keys passes 65504 (its 256 logits
    reach about three standard deviations of 80**2 * sqrt(16)), so a module that multiplies
    before scaling is found every time, not when the draw happens to be wide."""
    heads, _ = base_pair(caps)
    pairs = list(caps.shapes or [(h, d) for h in HEAD_COUNTS for d in HEAD_DIMS])
    heads, head_dim = max([p for p in pairs if p[0] == heads] or pairs,
                          key=lambda p: (p[1], -abs(p[0] - heads)))
    length = caps.length_near(WIDEST_LENGTH)
    return base_case(caps, torch.float16, device, num_heads=heads, head_dim=head_dim,
                     q_len=length, kv_len=length, causal=caps.causality.kind == "always")


class Stability(Check):
    """Large logits and shifted rows give the reference's answer, finite."""

    name = "stability"
    order = 120
    applies = "every implementation"
    title = "logits ~1e4 (and q/k std ~80 in float16) stay finite and right; row shifts change nothing"
    requires = frozenset({Structure.SOFTMAX})
    judged = "invariance to a shift of a row's logits"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        return reference_skip_reason(capabilities, "to set the logit scale")

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        masks = "kept" if caps.mask is not None else "none"
        wide = wide_dtypes(caps)
        if wide:
            context.explore(cases(caps, context.device, masks=masks, min_len=2, dtypes=wide),
                            lambda case: self.large_and_shifted(context, case))
        if torch.float16 in caps.floats.supported:
            context.explore(cases(caps, context.device, masks=masks,
                                  dtypes=(torch.float16,)),
                            lambda case: self.float16_large(context, case), severity="warn",
                            examples=[widest_case(caps, context.device)])

    def _agrees(self, context: CheckContext, case: Case, instance: Instance,
                weights: HeadWeights, what: str, largest_logit: float,
                reference_weights: HeadWeights | None = None, hint: str = HINT,
                ordinary: HeadWeights | None = None) -> None:
        """``instance`` loaded with ``weights`` agrees with the reference (one instance serves
        every weight set of an example: the weights are written, not rebuilt). ``hint`` names
        the cause of a non-finite output only where the same case with the ``ordinary``
        weights agrees with the reference (the failure is the large logits'); where it does not,
        the hint says so."""
        instance.write_weights(weights)
        inputs = case.inputs(context.capabilities.call)
        output = context.run(instance, inputs, case)
        rows = context.rows(case)
        encoding = context.capabilities.position.encoding
        try:
            expect_finite_rows(output, rows)
        except Violation as violation:
            cause = context.hint(lambda: self._cause(context, case, instance, ordinary, hint))
            raise Violation(f"{what}: {violation.summary}", hint=cause) from violation
        seen, _ = agree_with_reference(output, weights, inputs, case, rows,
                                       judged=context.judged(case.config.dtype),
                                       largest_logit=largest_logit,
                                       reference_weights=reference_weights, encoding=encoding)
        if not seen.ok:
            b, row, _ = seen.worst
            form = context.hint(lambda: form_hint(
                output, reference_weights or weights, inputs, causal=case.causal, rows=rows,
                window=case.window, chunk=case.chunk, encoding=encoding)
                or self._cause(context, case, instance, ordinary, None))
            raise Violation(f"{what}: the output differs from the reference ({seen.describe()}, "
                            f"row {row} of batch {b})", hint=form)

    @staticmethod
    def _cause(context: CheckContext, case: Case, instance: Instance,
               ordinary: HeadWeights | None, hint: str | None) -> str | None:
        """``hint`` when the same case with the ``ordinary`` weights is finite and agrees with
        the reference (only large logits break it); a pointer to the reference check when it
        does not; None when not measured."""
        if ordinary is None:
            return None
        instance.write_weights(ordinary)
        inputs = case.inputs(context.capabilities.call)
        rows = context.rows(case)
        try:
            output = context.run(instance, inputs, case)
            expect_finite_rows(output, rows)
            seen, _ = agree_with_reference(output, ordinary, inputs, case, rows,
                                           judged=context.judged(case.config.dtype),
                                           encoding=context.capabilities.position.encoding)
        except (Violation, ImplementationError):
            seen = None
        if seen is None or not seen.ok:
            return ("the same case at ordinary logits already differs from the reference: the "
                    "bug is not the large logits' (see reference)")
        if hint is None:
            return None
        return f"the same case at ordinary logits is right: {hint}"

    def large_and_shifted(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        weights = instance.read_weights()
        inputs = case.inputs(context.capabilities.call)
        encoding = context.capabilities.position.encoding
        q, k = _projections(weights, inputs, case, encoding)
        largest = float((q @ k.transpose(-1, -2)).abs().max()) / case.head_dim**0.5
        if largest == 0.0:
            return
        limit = LARGE_LOGIT
        fill = context.hint(lambda: own_fill(instance, inputs, case))
        if fill is not None and abs(fill) / 2 < LARGE_LOGIT:
            # Its own convention (BERT's -10000): logits past it are outside its normal range.
            limit = abs(fill) / 2
            context.observe(f"logits bounded to {limit:g}, half the finite fill {fill:g} its "
                            "masked logits are given (observed at its core)")
        factor = limit / largest
        big = replace(weights, w_q=weights.w_q * factor, b_q=weights.b_q * factor)
        self._agrees(context, case, instance, big, f"with logits up to {limit:g}",
                     limit, ordinary=weights)

        if encoding is not None and encoding.rotary is not None:
            # RoPE turns a key bias with the key's position: it no longer adds one constant to
            # a row's logits.
            context.observe("row-shift invariance not tested: under RoPE a shared key bias "
                            "rotates with each key's position")
            return
        # u with q_i . u / sqrt(Dh) of about ROW_SHIFT on average: every row moves by its own constant.
        typical = float(q.norm(dim=-1).mean()) / case.head_dim**0.5
        direction = case.tensor(*weights.b_k.shape, stream=91).to(weights.b_k.dtype)
        direction = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        shift = direction * (ROW_SHIFT / max(typical, 1e-12))
        shifted = replace(weights, b_k=weights.b_k + shift.to(weights.b_k.device))
        try:
            self._agrees(context, case, instance, shifted, f"with every row's logits shifted by "
                         f"about {ROW_SHIFT:g}", largest + 4 * ROW_SHIFT,
                         reference_weights=weights, ordinary=weights)
        except ImplementationError as error:
            if "has no bias" not in str(error):
                raise
            # The shift rides on the key bias; without one it can't be expressed.
            context.observe("row-shift invariance not tested: no key bias to shift logits with")

    def float16_large(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        weights = instance.read_weights()
        inputs = case.inputs(context.capabilities.call)
        q, k = _projections(weights, inputs, case, context.capabilities.position.encoding)
        # Root mean square, not std(): a single element has no std but has a magnitude.
        q_gain = FLOAT16_STD / max(float(q.pow(2).mean().sqrt()), 1e-12)
        k_gain = FLOAT16_STD / max(float(k.pow(2).mean().sqrt()), 1e-12)
        big = replace(weights, w_q=weights.w_q * q_gain, b_q=weights.b_q * q_gain,
                      w_k=weights.w_k * k_gain, b_k=weights.b_k * k_gain)
        largest = float(((q * q_gain) @ (k * k_gain).transpose(-1, -2)).abs().max())
        beyond = (f"in float16 with q and k of std {FLOAT16_STD:g} (beyond the normal range: "
                  f"q.k reaches {largest:.3g}"
                  + (", past float16's 65504" if largest > torch.finfo(torch.float16).max else "")
                  + ")")
        self._agrees(context, case, instance, big, beyond, largest / case.head_dim**0.5,
                     hint=FLOAT16_HINT, ordinary=weights)
