"""A one-line progress display for a terminal: count, rate and time left. Silent otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class GradingProgress:
    """``[ 7/40] 3.1/min · about 10:40 left · smithjohn: timeout`` on one rewritten line: each
    finished student with the status it ended with (and its points when graded).

    Only drawn when ``stream`` is a terminal (a log file or a pipe stays clean); the rate and
    estimate count submissions actually run, not those reused from a previous run. ``status``
    shows what happens before the count starts (the reference solution being graded).
    """

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.total = total
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = time.monotonic()
        self._width = 0

    def line(self, current: str = "") -> str:
        """The progress line for the current state (also used by tests)."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.done / elapsed * 60
        count = f"[{self.done:>{len(str(self.total))}}/{self.total}]"
        if self.done:
            left = (self.total - self.done) * elapsed / self.done
            minutes, seconds = divmod(round(left), 60)
            timing = f"{rate:.1f}/min · about {minutes}:{seconds:02d} left"
        else:
            timing = "starting"
        return f"{count} {timing}" + (f" · {current}" if current else "")

    def advance(self, current: str = "") -> None:
        self.done += 1
        self._draw(self.line(current))

    def status(self, text: str) -> None:
        """A line of its own before counting starts; an empty ``text`` clears it."""
        self._draw(text)
        if not text and self.enabled and self._width:
            self.stream.write("\r")
            self.stream.flush()

    def _draw(self, text: str) -> None:
        if not self.enabled:
            return
        padding = max(self._width - len(text), 0)
        self.stream.write("\r" + text + " " * padding)
        self.stream.flush()
        self._width = len(text)

    def close(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\n")
            self.stream.flush()
