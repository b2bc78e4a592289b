"""The kinds of bug the diagnosis names, and what each one's symptoms reach.

One table, read by the checks that name a bug (:mod:`conformance.checks.diagnosis`) and by
grading, which charges a bug once: to the rubric item of the check named for it (its ``home``),
excusing the items its symptoms reach (:mod:`conformance.grading.score.scoring`). A kind is the
``bug`` of a :class:`conformance.model.results.CheckResult`: two checks naming one kind saw one
mistake.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from conformance.model.check_names import CHECK_NAMES


class Bug(str, Enum):
    """The kinds of bug the diagnosis names (:class:`conformance.model.results.Hint`'s
    ``kind``): one key per mistake, whichever check names it and in whatever words."""

    SCALE_D_MODEL = "scale 1/sqrt(d_model)"
    SCALE_MISSING = "scale missing"
    SCALE_TWICE = "scale applied twice"
    SCALE_NUM_HEADS = "scale 1/sqrt(num_heads)"
    SCALE_INVERTED = "scale sqrt(head_dim)"
    SOFTMAX_OVER_QUERIES = "softmax over the query axis"
    OUTPUT_PROJECTION_SKIPPED = "output projection skipped"
    KEY_PROJECTION_FOR_VALUES = "key projection used for the values"
    SPLIT_WITHOUT_TRANSPOSE = "heads split without transpose"
    MERGE_WITHOUT_TRANSPOSE = "heads merged without transpose"
    CACHE_LAYOUT = "cache not in its declared layout"
    LEAK_AROUND_WEIGHTS = "the future leaks around causal weights"


MASK_KIND = "mask: "
"""The prefix of a mask mistake's kind (``mask: inverted``, see
:func:`conformance.checks.mask_mistakes.kind_of`)."""
CAUSAL_MASK_MISTAKES = frozenset({"hides_current", "shows_next", "ignores_causal", "transposed",
                                  "replaces_causal", "causal_undeclared"})
"""The mask mistakes of the causal mask (``Mistake`` names, lower case): charged to ``causal``;
the others (an inverted padding mask, one applied after the softmax) to ``padding``."""

MASK_JUDGE = "padding"
"""The check that judges the mask (its ``judges``): where it failed, each other failure is run
again without the mask, and one that then passes is the mask's, charged there."""

EVERY_JUDGEMENT = frozenset(CHECK_NAMES) - {"gate", "contract"}
"""Every check that judges what the layer computes: a mistake in the core of attention (heads
mixed, a softmax over the wrong axis, a wrong mask) changes what each of them sees."""
AGAINST_THE_REFERENCE = frozenset({
    "reference", "scale", "head_split", "fully_masked", "stability", "low_precision",
    "kv_cache", "position_shift", "alibi", "sliding_window", "chunked", "packed",
    "configuration", "kernel"})
"""The checks that compare the output with the float64 reference: a wrong scale or projection
changes each of them, and nothing the others measure."""


@dataclass(frozen=True)
class Reach:
    """Where a bug is charged (``home``, the check named for it) and the checks its symptoms
    fail (``checks``)."""

    home: str
    checks: frozenset[str]


REACH: dict[str, Reach] = {
    **{bug.value: Reach("scale", AGAINST_THE_REFERENCE) for bug in (
        Bug.SCALE_D_MODEL, Bug.SCALE_MISSING, Bug.SCALE_TWICE, Bug.SCALE_NUM_HEADS,
        Bug.SCALE_INVERTED)},
    Bug.SOFTMAX_OVER_QUERIES.value: Reach("row_stochastic", EVERY_JUDGEMENT),
    Bug.OUTPUT_PROJECTION_SKIPPED.value: Reach("reference", AGAINST_THE_REFERENCE),
    Bug.KEY_PROJECTION_FOR_VALUES.value: Reach("reference", AGAINST_THE_REFERENCE),
    Bug.SPLIT_WITHOUT_TRANSPOSE.value: Reach("head_split", EVERY_JUDGEMENT),
    Bug.MERGE_WITHOUT_TRANSPOSE.value: Reach("head_split", EVERY_JUDGEMENT),
    Bug.CACHE_LAYOUT.value: Reach("kv_cache", frozenset({"kv_cache"})),
    Bug.LEAK_AROUND_WEIGHTS.value: Reach("causal", AGAINST_THE_REFERENCE | {"causal"}),
}
"""Each named bug's reach. A symptom check that names a bug of its own is that bug's, never
another's."""


def reach(kind: str | None) -> Reach | None:
    """Where the bug of ``kind`` is charged and what its symptoms reach; None for a kind no
    table entry describes (charged where it is seen)."""
    if not kind:
        return None
    if kind.startswith(MASK_KIND):
        home = "causal" if kind[len(MASK_KIND):] in CAUSAL_MASK_MISTAKES else MASK_JUDGE
        return Reach(home, EVERY_JUDGEMENT)
    return REACH.get(kind)
