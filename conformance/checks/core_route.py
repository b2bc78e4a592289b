"""Judging a layer through its attention core, where its weights can't be mapped to per-head
q/k/v projections (latent-compressed keys, learned biases, two maps subtracted, queries from a
parameter, ...): what the checks that take that route share.

The core is observed inside the layer's own forward (:mod:`conformance.model.core`): each softmax
attention's logits, probabilities, the weights that multiply the values, q·kᵀ recomputed in
float64, the values and the result. A check measures its property there instead of skipping.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from hypothesis.strategies import SearchStrategy

from conformance.checks.diagnosis import AMBIGUOUS
from conformance.checks.invariants.base import CheckContext
from conformance.checks.invariants.verify import expect_output, position_skip_reason
from conformance.checks.invariants.violation import NotApplicable, Violation
from conformance.generation.base_case import base_case
from conformance.generation.cases import Case
from conformance.generation.strategies import cases
from conformance.inference.observing.attention_probe import ProbeUnfit
from conformance.model.core import AttentionSite, CoreObservation
from conformance.model.results import Route
from conformance.model.spec import Capabilities
from conformance.numerics.tolerance import eps
from conformance.subject.boundary import ImplementationError, Inputs, Instance

NO_WEIGHTS = "no weight layout maps it to per-head q/k/v projections"
NO_CORE = ("no attention core is visible in its forward either (no softmax over the keys of "
           "logits made by q·kᵀ, no scaled_dot_product_attention call: a hand-written exp/sum or "
           "a fused kernel)")

SECOND_STREAM = 7717
"""Where the second forward of a scale fit draws its tokens (another input, the same mask)."""

NOT_ONE_SCALE = ("at some core the logits are not one scale of q·kᵀ plus what the tokens don't "
                 "move (a transform bends them): the scale was not judged there")


def weights_skip_reason(capabilities: Capabilities) -> str | None:
    """Why the weights route does not apply (the check then goes through the core), or None."""
    if not capabilities.weights:
        return NO_WEIGHTS
    return position_skip_reason(capabilities)


def _same_mask(case: Case) -> Case:
    """``case`` with every batch element's mask the first one's: the rows a core's weights are
    judged on are then the same whichever axis of the core holds the batch."""
    if case.kept is None:
        return case
    return replace(case, kept=(case.kept[0],) * case.batch, mask_seed=None)


def core_cases(capabilities: Capabilities, device: str, **options) -> SearchStrategy[Case]:
    """Cases for a check through the core: at least two queries and two keys, one mask for the
    whole batch."""
    return cases(capabilities, device, min_len=2, **options).map(_same_mask)


def core_words(site: AttentionSite, index: int, count: int) -> str:
    """Which core, in words."""
    which = "the attention core" if count == 1 else f"attention core {index + 1} of {count}"
    return f"{which} ({site.how})"


def scale_mistakes(site: AttentionSite, fitted: float, tolerance: float,
                   case: Case) -> list[str]:
    """The likely bugs, in words, a fitted scale ``fitted`` matches at ``site``: several where
    they are equal at this size (the measurement can't tell them apart)."""
    width = site.widths[0]
    named: list[tuple[str, float]] = []
    if site.term_widths:
        joined = " + ".join(map(str, site.term_widths))
        for part in site.term_widths:
            named.append((f"1/sqrt({part}), the width of one of the parts q·kᵀ is made of "
                          f"({joined} = {width}): does the scale leave out the other part "
                          "(MLA's rotary dimensions)?", 1 / math.sqrt(part)))
    if site.combined > 1:
        named.append((f"1/sqrt({2 * width}), the width of q before it was split into the "
                      f"{site.combined} maps' parts: each map's logits contract {width}",
                      1 / math.sqrt(2 * width)))
    if case.head_dim != width:
        named.append((f"1/sqrt(head_dim) = 1/sqrt({case.head_dim}), the layer's head width "
                      f"(d_model / num_heads), where q and k meet at width {width}: is the scale "
                      "taken from the configured width instead of q's?",
                      1 / math.sqrt(case.head_dim)))
    named += [(f"1/sqrt(d_model) = 1/sqrt({case.d_model}): divided by sqrt(hidden_dim)?",
               1 / math.sqrt(case.d_model)),
              ("1 (no scaling): is the 1/sqrt(w) factor missing?", 1.0),
              (f"1/w = 1/{width}: is 1/sqrt(w) applied twice?", 1 / width),
              (f"sqrt(w) = sqrt({width}): multiplied instead of divided?", math.sqrt(width))]
    return [words for words, candidate in named
            if not math.isclose(candidate, 1 / math.sqrt(width))
            and matches(fitted, candidate, tolerance)]


def scale_hint(mistakes: list[str], fitted: float) -> str | None:
    """The hint of :func:`scale_mistakes`' findings: one named, several said together."""
    if not mistakes:
        return None
    if len(mistakes) == 1:
        return f"matches scale {mistakes[0]}"
    return f"matches scale {fitted:.3g}, {AMBIGUOUS}: " + "; or ".join(mistakes)


def observe(instance: Instance, inputs: Inputs, case: Case) -> CoreObservation:
    """One forward of ``inputs`` with the core observed, its output validated as every check's
    is."""
    seen = instance.observe(inputs)
    expect_output(seen.output, case, inputs)
    return seen


def require_core(context: CheckContext, unmapped: str) -> None:
    """Take the core route, where the gate's small case shows a core; else raise NotApplicable
    saying why neither way applies (``unmapped``: why the weights don't)."""
    caps = context.capabilities
    dtypes = caps.floats.supported
    dtype = next((d for d in dtypes if d in (torch.float32, torch.float64)), dtypes[0])
    case = base_case(caps, dtype, context.device)
    try:
        seen = observe(context.build(case), case.inputs(caps.call, use_mask=False), case)
    except (ImplementationError, Violation) as error:
        raise NotApplicable(f"{unmapped}, and its forward did not run to observe its core "
                            f"({str(error).splitlines()[0]})") from error
    if not seen.sites:
        raise NotApplicable(f"{unmapped}, and {NO_CORE}")
    context.route = Route.CORE


def sites_of(instance: Instance, inputs: Inputs, case: Case) -> tuple[AttentionSite, ...]:
    """The cores one forward shows; no example (ProbeUnfit) where it shows none at this case
    (its axes are ambiguous at these sizes: another as long as the queries)."""
    seen = observe(instance, inputs, case)
    if not seen.sites:
        raise ProbeUnfit("no attention core could be told apart at this case")
    return seen.sites


def second_inputs(case: Case, call: str) -> Inputs:
    """Other tokens for ``case``, with its mask."""
    return replace(case, seed=case.seed + SECOND_STREAM).inputs(call)


def two_forwards(instance: Instance, case: Case, call: str
                 ) -> tuple[tuple[AttentionSite, ...], tuple[AttentionSite, ...]]:
    """The cores of two forwards of ``case``'s shapes, its own tokens and other ones (the same
    mask): what a scale or a bias is measured from (:mod:`conformance.numerics.core_fit`)."""
    return (sites_of(instance, case.inputs(call), case),
            sites_of(instance, second_inputs(case, call), case))


def scale_tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of a fitted scale: 1 % plus the logits' rounding in ``dtype``."""
    return 0.01 + 2 * eps(dtype)


def matches(value: float, expected: float, tolerance: float) -> bool:
    return not math.isnan(value) and abs(value - expected) <= tolerance * expected
