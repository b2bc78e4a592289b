"""The suite's check names, in the order they run, importable without importing any check.

:mod:`conformance.run.runner` holds the checks themselves and asserts that they are these, in this
order; everything that only needs to know or validate a name (expected-failures files, rubrics,
``parametrize_with_checks``) reads it here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

CHECK_NAMES: tuple[str, ...] = (
    "gate", "contract", "padding", "fully_masked", "row_stochastic", "head_split", "causal",
    "reference", "scale", "mask_formats", "permutation", "batch_independence", "stability",
    "low_precision", "dropout", "autograd", "determinism", "path_agreement", "kv_groups",
    "position_shift", "alibi", "sliding_window", "chunked", "kv_cache", "packed", "configuration",
    "kernel",
)


THROUGH_THE_CORE: tuple[str, ...] = ("row_stochastic", "reference", "scale")
"""The checks with a second route: where no weight layout maps a layer, they judge it through
its attention core, observed in its forward (:class:`conformance.model.results.Route`)."""


def unknown_checks(names: Iterable[str]) -> str | None:
    """What is wrong with ``names`` in words (``unknown check 'paddng' (did you mean padding?)``),
    or None when every one is a check."""
    problems = []
    for name in names:
        if name in CHECK_NAMES:
            continue
        close = difflib.get_close_matches(str(name), CHECK_NAMES, n=1)
        problems.append(f"unknown check {name!r}" + (f" (did you mean {close[0]}?)" if close
                                                      else ""))
    if not problems:
        return None
    return "; ".join(problems) + f"; the checks: {', '.join(CHECK_NAMES)}"
