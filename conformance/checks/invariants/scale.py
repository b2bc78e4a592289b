"""Scale: the logits are scaled by 1/sqrt(head_dim).

Property: the measured attention weights are softmax(s * q_i . k_j) over the keys, and the scale
fitted from them (log A_ij - log A_ik = s (q_i . k_j - q_i . k_k), least squares over every row)
is 1/sqrt(head_dim) within 1% (plus two units in the last place of the dtype measured in).
Measured in float32 / float64 where it runs in either: the scale belongs to the algorithm. A
kernel that runs in half precision only is measured there, from its weights above the dtype's
smallest normal number (below it a weight's log is too coarse to fit), with the log-weight
residual allowed the dtype's rounding of logits and weights. When the fitted scale is another
recognisable one (1/sqrt(d_model), 1, 1/head_dim, 1/sqrt(num_heads), sqrt(head_dim)), the report
says which.

Through the core (where no weight layout applies): at every attention core the forward computes,
the logits are s·q·kᵀ + b, b what the tokens don't move (a mask, a learned position bias), and s
fitted from two forwards' changes (Δlogits = s·Δ(q·kᵀ)) is 1/sqrt(w) within the same tolerance,
w the width of q and k as the core contracts them (MLA: the rotary and non-rotary parts
together; differential attention: each map's half). A scale the forward passes to
``scaled_dot_product_attention`` is read, not fitted; a learned temperature (a parameter that
multiplies the logits, per head or one) is the layer's own design, described.

Explained before it is judged: where inference measured the layer's own scale (a
:class:`~conformance.model.forms.LogitScale`), that is the scale expected. One a constructor
setting gives is judged against the setting: built with another value, the fitted scale is that
value's (s = value, or value ** -0.5); a setting whose name says it is the scale and that changes
nothing fails. 1/w, which muP's and Granite's designs give and 1/sqrt(w) applied twice gives too,
is a warning naming both, unless a declaration (``scale``) states the scale: then any other
fails.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from conformance.checks.core_route import (
    NOT_ONE_SCALE,
    core_cases,
    core_words,
    matches,
    require_core,
    scale_hint,
    scale_mistakes,
    scale_tolerance,
    two_forwards,
    weights_skip_reason,
)
from conformance.checks.diagnosis import SOFTMAX_OVER_QUERIES, scale_groups
from conformance.checks.invariants.base import Check, CheckContext, Structure
from conformance.checks.invariants.likely_bug import likely_bug
from conformance.checks.invariants.row_stochastic import over_queries
from conformance.checks.invariants.verify import fmt
from conformance.checks.invariants.violation import Violation
from conformance.generation.cases import Case
from conformance.generation.strategies import (
    WIDE_DTYPES,
    cases,
    heads_apart,
    wide_or_own_dtypes,
)
from conformance.inference.observing.attention_probe import ProbeUnfit, probe
from conformance.model.forms import LogitScale, ScaleRelation
from conformance.model.remedies import Option, Remedy
from conformance.model.results import Hint, Route
from conformance.numerics.core_fit import (
    LOGIT_RESIDUAL,
    BiasForm,
    bias_form,
    bias_tolerance,
    fitted_scale,
    logit_bias,
)
from conformance.numerics.tolerance import eps

RESIDUAL = 0.05
"""Largest log-weight residual of a softmax of scaled dot products in float32/float64; a softmax
over the wrong axis, or of something else, leaves far more."""

UNSCALED_WITH_BIAS = (
    "the logits are not scaled at all and carry a position bias the tokens don't move: T5's "
    "convention (1/sqrt(w) folded into the initialisation of q, a learned relative bias): a "
    "design of its own if that is what it follows, a missing 1/sqrt(w) if not")
"""Why no scaling beside a measured position bias is a warning: behaviour can't tell T5's
convention from a forgotten scale; intent can."""

OTHER_VALUE = {ScaleRelation.MULTIPLIER: 0.2, ScaleRelation.INVERSE_SQRT: 3.0}
"""The value a scale setting is built with to see the fitted scale follow (not inference's)."""

INVERSE_WIDTH = ("the logit scale is 1/w, not 1/sqrt(w): muP's and Granite's design (their "
                 "attention multiplier's default), and also what 1/sqrt(w) applied twice gives: "
                 "a declaration of the scale decides")
"""Why 1/w is a warning: a published design and a known mistake give it alike; intent decides."""
INVERSE_WIDTH_REMEDY = Remedy((Option("scale", "head_dim", "state that 1/w is meant"),
                               Option("scale", "sqrt", "hold it to 1/sqrt(w)")))

MODEL_CONSTANT = ("the logit scale is the same at every width, which the model's architecture "
                  "fixes: T5's design (1/sqrt(w) folded into the initialisation of q), and also "
                  "what a missing 1/sqrt(w) gives: a declaration of the scale decides")
"""Why a constant scale in a layer its model builds is a warning: intent decides."""
MODEL_CONSTANT_REMEDY = Remedy((Option("scale", "none", "state that no scaling is meant"),
                                Option("scale", "sqrt", "hold it to 1/sqrt(w)")))


def _undeclared(law: LogitScale) -> tuple[str, str, Remedy]:
    """What a scale whose intent nothing declared is (after "the fitted logit scale is S"), its
    hint and its remedy (see LogitScale)."""
    if law.ambiguous:
        return " = 1/w", INVERSE_WIDTH, INVERSE_WIDTH_REMEDY
    return ", the same at every head width (measured)", MODEL_CONSTANT, MODEL_CONSTANT_REMEDY


RESIDUAL_ULPS = 16
"""Units in the last place added to RESIDUAL in a dtype: a half-precision kernel rounds its
logits (q.k of magnitude ~3 at relative eps/2 each) and its weights (relative eps/2)."""


def fit_scale(attention: torch.Tensor, logits: torch.Tensor,
              rows: torch.Tensor, bias: torch.Tensor | None = None,
              smallest: float = 0.0, softcap: float | None = None) -> tuple[float, float]:
    """Least-squares s in log A = s * logits + bias + c(row), over rows (B, Lq) and weights
    above ``smallest`` (``bias``: a position encoding's unscaled logit bias, ALiBi's); with a
    ``softcap`` c, in log A = c tanh(s * logits / c) + bias + c(row) (refined from the linear
    fit, the residual's minimum over s).

    Returns (s, largest residual of log A): a large residual means the weights are not a softmax
    of scaled dot products at all.
    """
    if softcap is not None:
        start, _ = fit_scale(attention, logits, rows, bias, smallest)
        if math.isnan(start):
            return start, 0.0

        def residual(s: float) -> float:
            capped = softcap * torch.tanh(s * logits / softcap)
            return fit_scale(attention, capped, rows, bias, smallest)[1]

        low, high = start / 2, start * 2
        for _ in range(60):  # golden-section search: the residual is unimodal near its minimum
            a, b = high - 0.618 * (high - low), low + 0.618 * (high - low)
            low, high = (low, b) if residual(a) < residual(b) else (a, high)
        s = (low + high) / 2
        return s, residual(s)
    usable = (attention > smallest) & rows[:, None, :, None] & torch.isfinite(attention)
    log_a = attention.clamp_min(1e-300).log()
    if bias is not None:
        log_a = log_a - bias
    log_a = torch.where(usable, log_a, 0.0)
    count = usable.sum(-1, keepdim=True).clamp_min(1)
    x_mean = (logits * usable).sum(-1, keepdim=True) / count
    y_mean = (log_a * usable).sum(-1, keepdim=True) / count
    dx = (logits - x_mean) * usable
    dy = (log_a - y_mean) * usable
    denominator = float((dx * dx).sum())
    if denominator == 0.0:
        return float("nan"), 0.0
    s = float((dx * dy).sum()) / denominator
    residual = float(((dy - s * dx) * usable).abs().max())
    return s, residual


class Scale(Check):
    """The logit scale fitted from the measured attention is 1/sqrt(head_dim)."""

    name = "scale"
    order = 80
    applies = "every implementation"
    title = "logits are scaled by 1/sqrt(head_dim)"
    requires = frozenset({Structure.SOFTMAX})
    judged = "the scale as a softmax temperature"

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        unmapped = weights_skip_reason(caps)
        if unmapped is not None:
            require_core(context, unmapped)
            context.explore(core_cases(caps, context.device, dtypes=wide_or_own_dtypes(caps)),
                            lambda case: self.verify_core(context, case))
            return
        context.route = Route.WEIGHTS
        # Sizes where the recognisable scales are all different from each other (where the
        # module builds for any such).
        apart = heads_apart(caps)
        strategy = cases(caps, context.device, probe=True, min_heads=2, min_len=2,
                         dtypes=wide_or_own_dtypes(caps)).filter(
            lambda c: c.head_dim >= 2 and (c.head_dim != c.num_heads or not apart))
        context.explore(strategy, lambda case: self.verify(context, case))

    def verify(self, context: CheckContext, case: Case) -> None:
        measured = probe(context.build(case), case, context.capabilities.call,
                         causal=case.causal, encoding=context.capabilities.position.encoding)
        rows = context.rows(case)
        dtype = case.config.dtype
        smallest = 0.0 if dtype in WIDE_DTYPES else torch.finfo(dtype).tiny
        encoding = context.capabilities.position.encoding
        fitted, residual = fit_scale(measured.attention, measured.logits, rows, measured.bias,
                                     smallest, softcap=encoding.softcap if encoding else None)
        if math.isnan(fitted) and residual == 0.0:
            return  # no row sees two keys (a window of one key): nothing to fit a scale to
        law = encoding.scale if encoding is not None else None
        expected = law.at(case.head_dim) if law is not None else 1 / math.sqrt(case.head_dim)
        tolerance = 0.01 + 2 * eps(dtype)
        if residual > RESIDUAL + RESIDUAL_ULPS * eps(dtype) or math.isnan(fitted):
            raise Violation(
                "the attention weights are not softmax(s * q.k) over the keys for any single "
                f"scale s (log-weight residual {fmt(residual)})",
                hint=SOFTMAX_OVER_QUERIES if over_queries(
                    measured.attention, 2 * (case.kv_len + 2) * eps(case.config.dtype)) else
                context.hint(lambda: self._computed(context, case)))
        if abs(fitted - expected) <= tolerance * expected:
            if law is not None:
                self.explained(context, case, law, fitted, tolerance)
            return
        hint = None
        for words, candidate in scale_groups(case.head_dim, case.num_heads):
            if abs(fitted - candidate) <= tolerance * candidate:
                hint = Hint(f"matches scale {words}", words.kind)
        said = (f"1/sqrt(head_dim) = 1/sqrt({case.head_dim})" if law is None or law.textbook
                else f"{law.law().replace('w', 'head_dim')} at head_dim {case.head_dim}")
        raise Violation(f"the fitted logit scale is {fmt(fitted)}, expected {said} = "
                        f"{fmt(expected)}" + ("" if law is None or law.argument is None else
                                              f" ({law.describe()})"), hint=hint)

    def explained(self, context: CheckContext, case: Case, law: LogitScale, fitted: float,
                  tolerance: float) -> None:
        """The layer's own scale ``law``, which ``fitted`` matches, judged: a setting's followed
        (built with another value), one whose name says it is the scale not ignored, 1/w a
        warning unless declared."""
        if law.argument is not None:
            value = OTHER_VALUE[law.relation]
            other = replace(case.config, settings=((law.argument, value),))
            encoding = context.capabilities.position.encoding
            measured = probe(context.subject.instantiate(other, case.seed), case,
                             context.capabilities.call, causal=case.causal, encoding=encoding)
            moved, _ = fit_scale(measured.attention, measured.logits, context.rows(case),
                                 measured.bias, softcap=encoding.softcap if encoding else None)
            asked = law.relation.scale(value)
            if abs(moved - asked) <= tolerance * asked:
                context.observe(f"the logit scale follows {law.argument}: built with "
                                f"{law.argument}={value:g}, fitted {fmt(moved)}")
                return
            ignored = abs(moved - fitted) <= tolerance * fitted
            raise Violation(
                f"built with {law.argument}={value:g} the fitted logit scale is {fmt(moved)}, "
                f"not {fmt(asked)}" + (f": {law.argument} is ignored (the scale stays "
                                       f"{fmt(fitted)})" if ignored else ""),
                hint=(f"is {law.argument} stored and never read (a scale hard-coded where the "
                      "logits are computed)?") if ignored else
                     f"does {law.argument} change something other than the logit scale?")
        if law.intent_undeclared:
            what, hint, remedy = _undeclared(law)
            raise Violation(f"at head_dim {case.head_dim} the fitted logit scale is "
                            f"{fmt(fitted)}{what}", severity="warn", hint=hint, remedy=remedy)

    @staticmethod
    def _computed(context: CheckContext, case: Case) -> str | None:
        """Where no single scale fits the weights: the known mistake of the computation the
        module's own output reproduces (the reference's diagnosis, :func:`likely_bug`: heads
        merged without their transpose, ...), so that one mistake is named alike everywhere."""
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        output = context.run(instance, inputs, case)
        return likely_bug(context, case, instance, inputs, output, context.rows(case))

    def verify_core(self, context: CheckContext, case: Case) -> None:
        first, second = two_forwards(context.build(case), case, context.capabilities.call)
        if len(first) != len(second):
            raise ProbeUnfit("the forward computed another number of cores for other tokens")
        dtype = context.judged(case.config.dtype)
        tolerance = scale_tolerance(dtype)
        encoding = context.capabilities.position.encoding
        law = encoding.scale if encoding is not None else None
        for index, (site, other) in enumerate(zip(first, second, strict=True)):
            fitted, residual = fitted_scale(site, other)
            if site.heads_mixed:
                context.observe(f"{core_words(site, index, len(first))}: the heads' logits are "
                                "mixed by a learned matrix (talking heads), its own design: no "
                                "scale of one head's q·kᵀ to judge there")
                continue
            if site.learned_scale:
                # A learned temperature (per head, or one) is a design: described, not held to
                # 1/sqrt(w); what training set it to is no contract.
                context.observe(f"{core_words(site, index, len(first))}: a learned parameter "
                                "multiplies the logits (a learned temperature), its own design: "
                                f"not held to 1/sqrt(w) (fitted {fmt(fitted)})")
                continue
            if not site.scalars_known or math.isnan(fitted):
                continue  # q or k scaled differently on its paths; or no logit moved
            if residual > LOGIT_RESIDUAL + RESIDUAL_ULPS * eps(dtype):
                context.observe(NOT_ONE_SCALE)
                continue
            if law is not None and any(matches(fitted, law.at(w), tolerance)
                                       for w in site.widths):
                if law.intent_undeclared:
                    what, hint, remedy = _undeclared(law)
                    raise Violation(f"{core_words(site, index, len(first))}: the fitted logit "
                                    f"scale is {fmt(fitted)}{what}", severity="warn",
                                    hint=hint, remedy=remedy)
                continue
            if (law is None or not law.declared) and any(
                    matches(fitted, 1 / math.sqrt(w), tolerance) for w in site.widths):
                continue
            width = site.widths[0]
            where = core_words(site, index, len(first))
            summary = (f"{where}: the fitted logit scale is {fmt(fitted)}, expected "
                       f"1/sqrt(w) = 1/sqrt({width}) = {fmt(1 / math.sqrt(width))}, w the width of "
                       "q and k where they meet")
            if matches(fitted, 1.0, tolerance) and bias_form(
                    logit_bias(site, other, fitted), bias_tolerance(site)) is not BiasForm.NONE:
                raise Violation(summary, severity="warn", hint=UNSCALED_WITH_BIAS)
            raise Violation(summary, hint=context.hint(lambda index=index: self._core_hint(
                context, case, index, tolerance)))

    def _core_hint(self, context: CheckContext, case: Case, index: int,
                   tolerance: float) -> str | None:
        """The likely bug the scale fitted at core ``index`` matches: on ``case``, or where the
        bugs it matches there are equal at its sizes, on a wider case where they are apart."""
        words = None
        for tried in (case, replace(case, head_dim=8, num_heads=2), replace(case, head_dim=6,
                                                                            num_heads=3)):
            first, second = two_forwards(context.build(tried), tried, context.capabilities.call)
            if index >= min(len(first), len(second)):
                continue
            fitted, _ = fitted_scale(first[index], second[index])
            mistakes = scale_mistakes(first[index], fitted, tolerance, tried)
            words = scale_hint(mistakes, fitted)
            if len(mistakes) <= 1:  # none, or one told apart from the others
                return words if tried is case or words is None else (
                    f"{words} (measured at head_dim {tried.head_dim}, {tried.num_heads} heads, "
                    "where the candidates are apart)")
        return words
