"""The live progress line of ``attention-conformance check``: which implementation, which check,
how many examples, how long; and a final line per implementation.

On a terminal the line is rewritten in place (stderr), a few times a second at most; elsewhere
(CI logs, a pipe) a line per finished check instead, so a slow run shows it is alive.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO

from conformance.model.results import CheckResult, Status

REDRAW_SECONDS = 0.2


class ProgressLine:
    """Progress of a check run. ``live``: rewrite one line in place (default: on a terminal);
    ``final``: a line per finished implementation (default: everywhere); ``lines``: a line per
    finished check (default: where the line is not live)."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None,
                 final: bool | None = None, lines: bool | None = None, total: int = 0) -> None:
        self.stream = stream or sys.stderr
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.live = tty if live is None else live
        self.final = True if final is None else final
        self.lines = (not self.live) if lines is None else lines
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self._implementation = ""
        self._check = ""
        self._examples = 0
        self._drawn = 0.0

    def check(self, implementation: str, check: str) -> None:
        """A check starts."""
        self._implementation, self._check, self._examples = implementation, check, 0
        self._draw(force=True)

    def example(self) -> None:
        """One more example tried."""
        self._examples += 1
        self._draw()

    def checked(self, result: CheckResult) -> None:
        """A check is done: its line, where lines are written."""
        if not self.lines:
            return
        self._clear()
        self.stream.write(f"{result.implementation} · {result.check}: {result.status.value} "
                          f"({result.seconds:.1f} s)\n")
        self.stream.flush()

    def finished(self, implementation: str, results: Sequence[CheckResult],
                 seconds: float) -> None:
        """An implementation is done: its final line."""
        self.done += 1
        if not self.final:
            return
        counts = {status: sum(r.status is status for r in results) for status in Status}
        words = [f"{counts[Status.PASSED]} passed"]
        words += [f"{counts[s]} {label}" for s, label in (
            (Status.FAILED, "failed"), (Status.WARNED, "warning(s)"),
            (Status.EXPECTED_FAILURE, "expected failure(s)"), (Status.SKIPPED, "skipped"),
            (Status.SUITE_ERROR, "suite error(s)"))
            if counts[s]]
        self._clear()
        self.stream.write(f"{implementation}: {', '.join(words)} in {seconds:.1f} s\n")
        self.stream.flush()
        self._draw(force=True)

    def close(self) -> None:
        self._clear()

    def _draw(self, force: bool = False) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if not force and now - self._drawn < REDRAW_SECONDS:
            return
        self._drawn = now
        where = f"[{self.done}/{self.total}] " if self.total > 1 else ""
        if self._implementation:
            text = (f"{where}{self._implementation} · {self._check} · {self._examples} "
                    f"example(s) · {now - self.start:.0f} s")
        else:  # checks run in other processes: only implementations finishing are seen here
            text = f"{where}implementations checked · {now - self.start:.0f} s"
        self.stream.write("\r\x1b[K" + text[:160])
        self.stream.flush()

    def _clear(self) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
