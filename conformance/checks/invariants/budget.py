"""A check's time budget: a slow implementation gets a verdict in bounded time, and says how much
of the search it got.

A check may start a new example while it has run less than its budget, and, whatever the time,
until each of its searches has run MIN_EXAMPLES examples: the floor in seconds bounds a slow
module's check, the floor in examples scales the budget with the measured cost of one example, so
a module too slow for the seconds still gets evidence. When the budget stops a search, the check
says how many examples ran of how many the profile asks for: a warning, never a silent pass.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

MIN_EXAMPLES = 3
"""Examples every search runs whatever its time: a property checked on fewer is barely checked,
and three calls of even a 10-second module are a bounded wait."""

SECONDS_PER_EXAMPLE = 1.2
"""A check's budget per example its profile asks for: 30 s for ``quick``'s 25, 180 s for
``thorough``'s 150. The bundled implementations' slowest check takes under a second for 25 here
(0.88 s, ``seed000-MultiHeadAttention``'s fully_masked, idle): a margin of 30 for a busy machine;
a 0.2 s-per-call module (about 120 calls in its costliest check) runs in full, a 1 s one stops
at 30 s."""


def budget_seconds(max_examples: int) -> float:
    """The time budget of a check whose profile asks for ``max_examples`` examples."""
    return SECONDS_PER_EXAMPLE * max_examples


class BudgetSpent(BaseException):
    """Raised before an example when the check's budget is spent. A BaseException, so no
    ``except Exception`` on the way (the implementation's, or the suite's around it) takes it
    for a failure, and hypothesis stops the search at once without shrinking anything."""


@dataclass
class Budget:
    """The time one check may take (see the module's docstring). ``seconds`` None: no limit."""

    seconds: float | None
    started: float = field(default_factory=time.monotonic)
    examples: int = 0
    """Examples started in this check, all its searches together."""
    cut: list[tuple[int, int]] = field(default_factory=list)
    """Per search the budget stopped: (examples it ran, examples it would have run)."""
    unshrunk: bool = False
    """The budget ran out while a failure was being shrunk: its case is the first found."""
    _in_search: int = 0

    def search(self) -> None:
        """A new search begins."""
        self._in_search = 0

    def allow(self) -> None:
        """Before an example: raise BudgetSpent where the budget is spent and this search has
        had its MIN_EXAMPLES."""
        if (self.seconds is not None and self._in_search >= MIN_EXAMPLES
                and self.elapsed() > self.seconds):
            raise BudgetSpent()
        self._in_search += 1
        self.examples += 1

    def stopped(self, planned: int) -> None:
        """The budget stopped the current search, which would have run ``planned`` examples."""
        self.cut.append((self._in_search, planned))

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def shortfall(self) -> str | None:
        """What the budget cut short, in one line, or None where every search ran in full."""
        if not self.cut:
            return None
        ran = sum(done for done, _ in self.cut)
        planned = sum(asked for _, asked in self.cut)
        return (f"its time budget ({self.seconds:g} s) ran out: {ran} of the {planned} examples "
                f"asked for ran ({self.examples} in all, in {self.elapsed():.0f} s)")
