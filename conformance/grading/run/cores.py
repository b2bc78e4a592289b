"""The cores a grading run may use, and which of them are idle.

A grading run is given a number of cores (``grade --jobs N``; Gradescope's container: all of
them). Each submission being graded holds one; while fewer submissions remain than cores (the
end of a class, a single Gradescope submission, a self-test's last mutants), the idle ones are
lent to a running submission, whose checks then share them (:mod:`.sharing`). A core is lent
to one submission at a time and returned when its checks end.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Cores:
    """``count`` cores: held by the submissions being graded, lent out when idle."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"a grading run needs at least one core, not {count}")
        self.count = count
        self._busy = 0
        self._lock = threading.Lock()

    def hold(self) -> None:
        """A submission starts: it takes a core (more submissions than cores may be running
        where the caller's pool is wider; then none is idle)."""
        with self._lock:
            self._busy += 1

    def release(self, count: int = 1) -> None:
        """A submission ended, or lent cores come back."""
        with self._lock:
            self._busy = max(0, self._busy - count)

    @contextlib.contextmanager
    def held(self) -> Iterator[Cores]:
        """One core held while a submission is graded."""
        self.hold()
        try:
            yield self
        finally:
            self.release()

    def borrow(self, most: int) -> int:
        """Up to ``most`` idle cores, now lent to the caller (who releases them): how many."""
        with self._lock:
            lent = max(0, min(most, self.count - self._busy))
            self._busy += lent
            return lent

    @property
    def idle(self) -> int:
        with self._lock:
            return max(0, self.count - self._busy)
