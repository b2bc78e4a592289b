"""Causal: no position sees the future, and none is hidden from its own past.

Property: for a causal implementation (q_len == kv_len), output row t is unchanged when any input
at a position > t changes, and the gradient of rows <= t with respect to every input at a position
> t is exactly zero, with a padding mask as without one (a mask must not replace the causal
masking); and nothing is over-masked: every row t gives positive attention weight to every position
s <= t (measured with the attention-matrix probe, or, without weight access, as a non-zero gradient
of row t with respect to each position s <= t), where a softmax over the keys normalises (another
normaliser's zero on a visible key, a stick-breaking row's own token, a top-k selection, is its
structure: the reference's). With a sliding window of W keys, "every position s
<= t" is every position t - W + 1 <= s <= t (what lies before the window is the sliding_window
check's); in causal chunks, what a row sees of its past is the chunked check's. Only the rows
attention specifies are judged: a row its structure and the padding leave no key is fully_masked's.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from conformance.checks.diagnosis import Bug, explain
from conformance.checks.invariants.base import Check, CheckContext, observed_normaliser
from conformance.checks.invariants.causal_core import core_hint
from conformance.checks.invariants.verify import (
    expect_finite_rows,
    fmt,
    reference_applies,
    revealing,
)
from conformance.checks.invariants.violation import Lacking, Violation
from conformance.checks.mask_mistakes import (
    Mistake,
    kind_of,
    mask_mistakes,
    named,
    weights_mistake,
)
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.inference.observing.attention_probe import measure_attention
from conformance.model.results import Hint
from conformance.model.spec import Capabilities
from conformance.numerics.reference import allowed_keys
from conformance.numerics.tolerance import abs_error, eps, only_rows, unchanged_tolerance, worst_index
from conformance.subject.boundary import ImplementationError, Inputs, Instance


def _perturb_after(inputs: Inputs, cut: int, case: Case) -> Inputs:
    """Every input at positions > cut replaced with fresh noise."""
    def replaced(tensor: torch.Tensor, stream: int) -> torch.Tensor:
        noise = case.tensor(*tensor.shape, stream=stream, scale=3.0)
        future = torch.zeros(tensor.shape[1], dtype=torch.bool, device=tensor.device)
        future[cut + 1:] = True
        return torch.where(future[None, :, None], noise, tensor)

    if inputs.is_self:
        return Inputs.self_attention(replaced(inputs.query, 21), inputs.keep, causal=True)
    return Inputs(replaced(inputs.query, 21), replaced(inputs.key, 22),
                  replaced(inputs.value, 23), inputs.keep, causal=True)


def _dependence(context: CheckContext, instance: Instance, inputs: Inputs, case: Case,
                output: torch.Tensor) -> torch.Tensor:
    """(B, Lq, Lk) bool: whether output row t changes when the key/value inputs (self-attention:
    x) at position s alone are replaced by fresh noise, in each batch element."""
    tolerance = unchanged_tolerance(context.judged(output.dtype), output)
    seen = torch.zeros(case.batch, case.q_len, case.kv_len, dtype=torch.bool)
    for position in range(case.kv_len):
        where = torch.zeros(case.batch, case.kv_len, dtype=torch.bool)
        where[:, position] = True
        changed = context.run(instance, case.replace_positions(inputs, where, stream=33,
                                                               scale=3.0), case)
        seen[:, :, position] = (abs_error(changed, output, nan_equal=True) > tolerance).any(-1)
    return seen


CAUSAL_MISTAKES = (Mistake.HIDES_CURRENT, Mistake.SHOWS_NEXT, Mistake.IGNORES_CAUSAL, Mistake.TRANSPOSED)

PATTERN_LENGTHS = (5, 7)
"""Lengths of the unmasked cases a causal mistake's pattern must also show without weight
access: a pattern of which rows each position changes is coarse, and a scrambled module can
fit one mask's pattern at one size."""


def _pattern(context: CheckContext, case: Case) -> tuple[set[Mistake], set[Mistake]] | None:
    """Which causal-mask mistakes ``case`` can tell from the correct mask, and which of those
    the module's pattern fits (which output rows each position's inputs change is exactly the
    pattern that mask gives); None when it can't be measured."""
    instance = context.build(case)
    inputs = case.inputs(context.capabilities.call)
    try:
        output = context.run(instance, inputs, case)
        seen = _dependence(context, instance, inputs, case, output)
    except (Violation, ImplementationError):
        return None
    rows = context.rows(case)
    keep = None if inputs.keep is None else inputs.keep.cpu()
    correct = allowed_keys(case.batch, case.q_len, case.kv_len, keep, True,
                           window=case.window, chunk=case.chunk)[:, 0]
    told, fits = set(), set()
    for mistake in mask_mistakes(case.batch, case.q_len, case.kv_len, keep, causal=True,
                                 window=case.window, chunk=case.chunk):
        if mistake.kind not in CAUSAL_MISTAKES:
            continue
        visible = mistake.visible()[:, 0]
        expected = visible
        if inputs.is_self:
            # x at position t is row t's query too: it moves row t whenever the row weighs
            # two keys or more.
            weighs = visible.sum(dim=-1) >= 2
            expected = visible | (torch.diag_embed(weighs) & weighs[:, :, None])
        compared = visible.any(dim=-1) & rows.cpu()
        if not bool((compared & (visible != correct).any(dim=-1)).any()):
            continue
        told.add(mistake.kind)
        if bool((seen == expected)[compared].all()):
            fits.add(mistake.kind)
    return told, fits


def _pattern_mistake(context: CheckContext, case: Case) -> Mistake | None:
    """The causal-mask mistake whose pattern the module shows without weight access: on
    ``case`` where it tells the mistakes apart, and on unmasked cases of PATTERN_LENGTHS
    positions; named only when exactly one mistake fits everywhere it was told apart, and it
    was told apart (and fit) on two cases at least."""
    caps = context.capabilities
    tried = [case] + [replace(case, q_len=length, kv_len=length, kept=None, mask_seed=None)
                      for length in PATTERN_LENGTHS if caps.length_near(length) == length]
    consistent, shown = set(CAUSAL_MISTAKES), dict.fromkeys(CAUSAL_MISTAKES, 0)
    for one in tried:
        measured = _pattern(context, one)
        if measured is None:
            continue
        told, fits = measured
        consistent &= fits | (set(CAUSAL_MISTAKES) - told)
        for mistake in fits:
            shown[mistake] += 1
    fitting = [mistake for mistake in consistent if shown[mistake] >= 2]
    return fitting[0] if len(fitting) == 1 and len(consistent) == 1 else None


QUERY_AXIS = Hint("matches the reference with its softmax over the query axis (dim=-2 where -1 "
                  "is meant): each key's weights are normalised over every query, later ones "
                  "included, so a row changes with later positions: softmax over the wrong "
                  "dimension?", Bug.SOFTMAX_OVER_QUERIES.value)
"""Named with the kind the reference, scale and row_stochastic checks give this mistake."""

def _mask_mistake(context: CheckContext, case: Case,
                  attention: torch.Tensor | None) -> Mistake | None:
    """The causal-mask mistake the module's behaviour reproduces on ``case`` (see
    :meth:`Causal._mistake`), or None."""
    caps = context.capabilities
    found = None
    if attention is not None:
        tolerance = 4 * eps(context.judged(case.config.dtype))
        found = weights_mistake(attention, None, causal=True, tolerance=tolerance,
                                window=case.window, chunk=case.chunk, logits=torch.zeros_like(attention),
                                only=CAUSAL_MISTAKES)
    if found is None and reference_applies(caps):
        found = context.mask_mistake(case, only=CAUSAL_MISTAKES)
    elif found is None and not caps.position.positional:
        found = _pattern_mistake(context, case)
    return found


def _computation_mistake(context: CheckContext, case: Case) -> Hint | None:
    """The known mistake of the computation (not the mask) the module's output reproduces
    (weights known, the reference applies; :func:`~conformance.checks.diagnosis.explain`) on
    ``case`` or, where that can't tell, its revealing case, where it is one that makes a masked
    forward depend on later positions: a softmax over the query axis (QUERY_AXIS), heads merged
    or split without their transpose; named with its kind as the reference check names it."""
    caps = context.capabilities
    if not reference_applies(caps):
        return None
    for tried in (case, revealing(caps, case)):
        if tried is None:
            continue
        instance = context.build(tried)
        inputs = tried.inputs(caps.call)
        words = explain(context.run(instance, inputs, tried), instance.read_weights(), inputs,
                        causal=tried.causal, rows=context.rows(tried), window=tried.window, chunk=tried.chunk,
                        encoding=caps.position.encoding)
        kind = getattr(words, "kind", None)
        if kind == Bug.SOFTMAX_OVER_QUERIES.value:
            return QUERY_AXIS
        if kind in MIXES_POSITIONS:
            return Hint(f"{words}: rows of different positions are mixed, so a row changes "
                        "with later ones", kind)
    return None


MIXES_POSITIONS = (Bug.MERGE_WITHOUT_TRANSPOSE.value, Bug.SPLIT_WITHOUT_TRANSPOSE.value)
"""The mistakes of the computation that make a correctly masked forward depend on later
positions (the scale's, the projections' do not: the causal check never fails for them)."""


def _cut(case: Case) -> int:
    """The last position kept as the inputs after it change: 0 .. q_len - 2, by the seed."""
    return case.seed % max(case.q_len - 1, 1)


def causal_mistake(context: CheckContext, case: Case) -> Hint | None:
    """The likely bug that makes the module's forward not causal on ``case``, named with its
    kind: a causal-mask mistake its behaviour reproduces, else a mistake of the computation that
    mixes positions its output reproduces (:func:`_computation_mistake`); None where neither is
    shown. What the causal check names (without a
    padding mask), for a check whose failure follows from the forward not being causal."""
    in_core = context.hint(lambda: core_hint(context, case,
                                             case.inputs(context.capabilities.call), leaks=False))
    if in_core is not None:
        return in_core
    found = _mask_mistake(context, case, None)
    if found is not None:
        return named(found)
    return context.hint(lambda: _computation_mistake(context, case))


class Causal(Check):
    """Rows never see later positions and always see earlier ones."""

    name = "causal"
    order = 60
    applies = "causal attention (always, or through an argument)"
    title = "no row sees a later position; every row sees itself and earlier ones"

    def skip_reason(self, capabilities: Capabilities) -> str | None:
        if capabilities.causality.kind == "never":
            return Lacking("non-causal attention")
        return None

    def run(self, context: CheckContext) -> None:
        caps = context.capabilities
        context.explore(cases(caps, context.device, causal=True, min_len=2, masks="auto"),
                        lambda case: self.future_invisible(context, case))
        if caps.weights:
            context.explore(cases(caps, context.device, causal=True, probe=True),
                            lambda case: self.weights_causal(context, case))
        elif not caps.forward_only:  # seen through gradients, which it has none of
            context.explore(cases(caps, context.device, causal=True),
                            lambda case: self.past_visible(context, case))

    def future_invisible(self, context: CheckContext, case: Case) -> None:
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        cut = _cut(case)
        before = context.run(instance, inputs, case)
        try:
            expect_finite_rows(before, context.rows(case))
        except Violation as violation:
            violation.hint = context.hint(lambda: self._mistake(context, case, inputs))
            raise
        after = context.run(instance, _perturb_after(inputs, cut, case), case)
        diff = only_rows(abs_error(after, before), context.rows(case))[:, : cut + 1]
        tolerance = unchanged_tolerance(context.judged(before.dtype), before)
        if float(diff.max()) > tolerance:
            b, row, _ = worst_index(diff)
            hint = context.hint(lambda: self._mistake(context, case, inputs))
            raise Violation(
                f"changing inputs after position {cut} changed output row {row} of batch {b} "
                f"by {fmt(float(diff[b, row].max()))} (tolerance {fmt(tolerance)})"
                + ("" if inputs.keep is None else ", with a padding mask given"),
                details=[] if inputs.keep is None else [
                    f"batch {b} keeps keys {[int(i) for i in torch.nonzero(inputs.keep[b])]}"],
                hint=hint)

        if context.capabilities.forward_only:
            return
        cotangent = torch.zeros_like(before)
        cotangent[:, : cut + 1] = case.tensor(case.batch, cut + 1, before.shape[-1], stream=31)
        # Only the rows attention specifies: a row with no key to attend to (its structure and
        # the padding together) or a padded query is unjudged here, NaN or not.
        cotangent = cotangent * context.rows(case).to(cotangent.device)[:, :, None]
        gradients = instance.gradients(inputs, cotangent).inputs
        for name, gradient in gradients.items():
            future = gradient[:, cut + 1:].abs().to(torch.float64).cpu()
            if future.numel() and float(future.max()) != 0.0:
                b, position, _ = worst_index(future)
                raise Violation(
                    f"the gradient of rows <= {cut} with respect to {name} at later position "
                    f"{cut + 1 + position} (batch {b}) is {fmt(float(future[b, position].max()))},"
                    " not exactly 0")

    def _mistake(self, context: CheckContext, case: Case, inputs: Inputs, *,
                 attention: torch.Tensor | None = None) -> str | None:
        """The causal-mask mistake the module's behaviour reproduces, in words with its kind,
        or None: with weight access, shown by the weights ``attention`` at zero logits or by the
        float64 reference under that mask (on ``case``, or its revealing case); without, by which
        rows each position's inputs change (:func:`_pattern_mistake`). Causal without the padding
        mask ``inputs`` gives and not with it: the padding mask replaces (or undoes) it. Where no
        mask mistake shows, a computation mistake mixing positions (:func:`causal_mistake`)."""
        # The core's weights, where no reference says more: a leak around causal weights
        # shows the same pattern as a causal mask not applied. Where one does, it comes last.
        mapped = reference_applies(context.capabilities)
        if attention is None and not mapped:
            in_core = context.hint(lambda: core_hint(context, case, inputs, leaks=True))
            if in_core is not None:
                return in_core
        found = _mask_mistake(context, case, attention)
        if found is None:
            axis = context.hint(lambda: _computation_mistake(context, case)
                                or (core_hint(context, case, inputs, leaks=True) if mapped
                                    else None))
            if axis is not None:
                return axis
        words = named(found)
        if found not in (None, Mistake.IGNORES_CAUSAL) or inputs.keep is None:
            return words
        try:
            causal_without = self._causal_without_mask(context, context.build(case), inputs,
                                                       case, _cut(case))
        except (Violation, ImplementationError):
            return words
        if not causal_without:
            return words
        if found is Mistake.IGNORES_CAUSAL:
            return Hint(f"{Mistake.REPLACES_CAUSAL.words} (it is causal without a mask, not with "
                        "one)", kind_of(Mistake.REPLACES_CAUSAL))
        return ("the module is causal without a mask, not with the padding mask given: the "
                "padding mask undoes the causal masking")

    @staticmethod
    def _causal_without_mask(context: CheckContext, instance, inputs: Inputs, case: Case,
                             cut: int) -> bool:
        """Whether the same perturbation leaves rows <= cut unchanged without the mask."""
        plain = inputs.with_mask(None)
        before = context.run(instance, plain, case)
        after = context.run(instance, _perturb_after(plain, cut, case), case)
        tolerance = unchanged_tolerance(context.judged(before.dtype), before)
        return float(abs_error(after, before)[:, : cut + 1].max()) <= tolerance

    def weights_causal(self, context: CheckContext, case: Case) -> None:
        # Zero logits: row t gives exactly 1/(t + 1) to each position it may see, so "visible"
        # can't be mistaken for an underflowed weight, even in float16.
        attention = measure_attention(context.build(case), case, context.capabilities.call,
                                      causal=True, gain=0.0)
        length = case.q_len
        tolerance = eps(context.judged(case.config.dtype))

        def mistake() -> str | None:
            # Measured without a padding mask: a mask that replaces the causal one can't show.
            return context.hint(lambda: self._mistake(
                context, case, case.inputs(context.capabilities.call, use_mask=False),
                attention=attention))

        later = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
        if bool(torch.isnan(attention).any()):
            b, h, row, _ = (int(i) for i in torch.nonzero(torch.isnan(attention))[0])
            raise Violation(f"batch {b}, head {h}, row {row} has NaN attention weights",
                            hint=mistake())
        future = attention * later
        if float(future.max()) > tolerance:
            b, h, row, key = worst_index(future)
            raise Violation(
                f"batch {b}, head {h}, row {row} gives later position {key} attention weight "
                f"{fmt(float(attention[b, h, row, key]))}, not 0", hint=mistake())
        if case.chunk is not None:
            return  # what a chunked row sees of its past is the chunked check's, edges exact
        if observed_normaliser(context.capabilities) is not None:
            # Another normaliser observed (a stick-breaking row that never weighs its own token,
            # a top-k selection): a visible key it weighs 0 is its structure, which the
            # reference applies; the future is what is judged here.
            return
        # The keys the structure (causal, its window) leaves each row: what lies before the
        # window is the sliding_window check's.
        visible = allowed_keys(1, length, length, None, True, window=case.window)[0, 0]
        past = attention.masked_fill(~visible, float("inf"))
        if float(past.min()) <= 0.0:
            b, h, row, key = worst_index(-past)
            raise Violation(
                f"batch {b}, head {h}, row {row} gives position {key} <= {row} attention weight "
                f"{fmt(float(attention[b, h, row, key]))}: over-masked", hint=mistake())

    def past_visible(self, context: CheckContext, case: Case) -> None:
        if case.chunk is not None:
            return  # what a chunked row sees of its past is the chunked check's
        instance = context.build(case)
        inputs = case.inputs(context.capabilities.call)
        row = case.seed % case.q_len
        output = context.run(instance, inputs, case)
        cotangent = torch.zeros_like(output)
        cotangent[:, row] = case.tensor(case.batch, output.shape[-1], stream=32)
        gradients = instance.gradients(inputs, cotangent).inputs
        gradient = gradients["x"] if "x" in gradients else gradients["value"]
        first = max(0, row + 1 - (case.window or row + 1))
        reach = gradient[:, first : row + 1].abs().to(torch.float64).cpu().amax(dim=-1)
        if float(reach.min()) == 0.0:
            b, position = worst_index(-reach)
            position += first
            raise Violation(
                f"output row {row} of batch {b} does not depend on position {position} <= {row}:"
                " over-masked", hint=context.hint(lambda: self._mistake(context, case, inputs)))
