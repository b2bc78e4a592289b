"""``check --watch FILE::Class``: a warm process that checks the file again on every save.

torch, the suite and the zygote stay loaded, so a save costs a forked worker, the class loaded
and inferred in it, and the checks: no interpreter start, no imports. The checks that failed or
warned last time run first, each with its failing example first (hypothesis' example database,
always kept here: see :func:`~conformance.generation.profiles.example_database`), and their
verdict lines come as soon as each is known; then the rest; then one line for the save.

Inference is redone on every save, in the fresh worker that loads the saved file: an edit to a
forward's body can change what behaviour shows (the mask's polarity, which parameters reproduce
the output), and a cached interface would then check the new code against the old one.

Ctrl-C ends the loop between saves or during a run; the workers and the zygote end with it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from conformance.errors import ConformanceError
from conformance.frontends.interface_language import error_words
from conformance.model.results import CheckResult, Status

FINDINGS = (Status.FAILED, Status.WARNED, Status.SUITE_ERROR)
"""What is run first next time: what failed, warned, or could not be judged."""

POLL_SECONDS = 0.05
"""How often the watched files' modification times are read (no inotify: nothing to install,
and a save is seen within this; a stat every 50 ms costs nothing measurable)."""

SETTLE_SECONDS = 0.05
"""How long a save is left to land before it is read (an editor may write a file in several
steps; one read mid-save is a syntax error, said in a line, and the next step is a save too)."""

CheckOnce = Callable[[Sequence[str], "WatchLines"], list[CheckResult]]
"""Checks the target once, its checks in the order given, telling ``WatchLines`` as it goes."""


class WatchLines:
    """The run's progress as a watcher wants it: a line as soon as a check fails, warns, or
    passes where it failed last time; nothing for the rest (the save's line counts them)."""

    def __init__(self, stream: TextIO, before: Sequence[str]) -> None:
        self.stream, self.before = stream, set(before)
        self.start = time.monotonic()

    def check(self, implementation: str, check: str) -> None:
        pass

    def example(self) -> None:
        pass

    def checked(self, result: CheckResult) -> None:
        if result.status in FINDINGS:
            words = f"{result.status.value}: {result.reason or ''}".strip().rstrip(":")
        elif result.check in self.before and result.status is Status.PASSED:
            words = "passes now"
        else:
            return
        self.stream.write(f"  {result.check}: {_first_line(words)} "
                          f"({time.monotonic() - self.start:.1f} s)\n")
        self.stream.flush()

    def finished(self, implementation: str, results: Sequence[CheckResult],
                 seconds: float) -> None:
        pass


def _first_line(text: str, width: int = 100) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def order(checks: Sequence[str], first: Sequence[str]) -> list[str]:
    """``checks`` with those in ``first`` (in its order) ahead of the rest (in theirs)."""
    ahead = [check for check in first if check in checks]
    return ahead + [check for check in checks if check not in ahead]


def summary(results: Sequence[CheckResult], seconds: float) -> str:
    """The save's line: what failed, by name, and how many of the rest did what."""
    by_status = {status: [r.check for r in results if r.status is status] for status in Status}
    words = [f"{status.value}: {', '.join(dict.fromkeys(by_status[status]))}"
             for status in FINDINGS if by_status[status]]
    words.append(f"{len(by_status[Status.PASSED])} passed")
    if by_status[Status.SKIPPED]:
        words.append(f"{len(by_status[Status.SKIPPED])} skipped")
    if by_status[Status.EXPECTED_FAILURE]:
        words.append(f"{len(by_status[Status.EXPECTED_FAILURE])} expected failure(s)")
    return " · ".join(words) + f" · {seconds:.1f} s"


def _stamps(paths: Sequence[Path]) -> tuple[float | None, ...]:
    return tuple(path.stat().st_mtime_ns if path.exists() else None for path in paths)


def watch(check_once: CheckOnce, paths: Sequence[Path], checks: Sequence[str],
          stream: TextIO, *, saves: int | None = None, poll: float = POLL_SECONDS) -> int:
    """Check once, then again after every save of ``paths``, until Ctrl-C (or ``saves`` saves,
    for tests); the exit status of the last run (0: no failure), 130 on Ctrl-C."""
    findings: list[str] = []
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Inherited ignored (a parent that ignores it: a CI job, a test runner's worker): Ctrl-C
        # is how a watch ends, so it raises KeyboardInterrupt here whatever the parent did.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    stamps = _stamps(paths)
    runs, status = 0, 0
    names = ", ".join(path.name for path in paths)
    try:
        while True:
            lines = WatchLines(stream, findings)
            start = time.monotonic()
            try:
                results = check_once(order(checks, findings), lines)
            except ConformanceError as error:  # a save mid-edit: a syntax error, say
                stream.write(f"[{time.strftime('%H:%M:%S')}] {names}: "
                             f"{error_words(error, 'cli')}\n")
                status = 2
            else:
                stream.write(f"[{time.strftime('%H:%M:%S')}] {names}: "
                             f"{summary(results, time.monotonic() - start)}\n")
                findings = list(dict.fromkeys(r.check for r in results
                                              if r.status in FINDINGS))
                status = 1 if any(r.is_failure for r in results) else 0
            stream.flush()
            if saves is not None and runs >= saves:
                return status
            runs += 1
            while _stamps(paths) == stamps:
                time.sleep(poll)
            time.sleep(SETTLE_SECONDS)
            stamps = _stamps(paths)
    except KeyboardInterrupt:
        stream.write("\nwatch stopped\n")
        return 130
