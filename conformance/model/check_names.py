"""The suite's check names, in the order they run, importable without importing any check.

Each check says its own name and order in its module of ``conformance/checks/invariants`` (the
class attributes ``name`` and ``order``, one after the other, as plain literals); they are read
here from the modules' text, so that what only needs to know or validate a name (expected-failures
files, rubrics, ``parametrize_with_checks``, the command line's choices) imports no check.
:mod:`conformance.checks.catalogue` imports the checks themselves and holds them to these names.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from pathlib import Path

CHECKS_DIRECTORY = Path(__file__).resolve().parent.parent / "checks" / "invariants"
DECLARED = re.compile(r'^    name = "(\w+)"\n    order = (\d+)\n', re.MULTILINE)
"""A check class's name and order, as its module states them."""


def _read_names() -> tuple[str, ...]:
    """The gate, then each check's name by its order."""
    found = []
    for path in sorted(CHECKS_DIRECTORY.glob("*.py")):
        found += [(int(order), name) for name, order in DECLARED.findall(path.read_text())]
    return ("gate", *(name for _, name in sorted(found)))


CHECK_NAMES: tuple[str, ...] = _read_names()
"""The gate first, then the checks in the order they run and report."""


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
