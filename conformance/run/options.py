"""How a run searches and what it covers, said once: :class:`RunOptions`.

Each front end (``check`` and its ``--watch``, ``serve``'s forked ``check``, ``grade``, the
pytest plugin, :mod:`conformance.testing`) builds one from its own options and hands it whole to
:func:`~conformance.run.many.check_many` or :meth:`~conformance.run.runner.Runner.of`; a replayed
case is read by :func:`replay_case` wherever its text comes from.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conformance.generation.cases import Case

if TYPE_CHECKING:
    from hypothesis.database import ExampleDatabase


@dataclass(frozen=True)
class RunOptions:
    """One run's options.

    ``profile``: the hypothesis profile (``quick``, ``thorough``, or ``hypothesis:NAME``, a
    profile the user registered); ``seed``: the examples are drawn from it (None: the
    profile's); ``verbosity``: hypothesis' (pytest's ``--hypothesis-verbosity``).
    ``strict`` promotes warnings (robustness findings beyond the normal range) to failures.
    ``replay``: a falsifying example to run alone instead of a search (see :func:`replay_case`).
    ``time_budget``: each check's, in seconds (None: the profile's; 0: none). ``database``:
    hypothesis' example database for interactive use (failing examples kept and replayed first;
    see :func:`~conformance.generation.profiles.example_database`; None keeps none).
    ``pictures``: each finding's minimal case drawn (``CheckResult.picture``), for a report that
    shows them. ``devices``: where to check (None: every available device); ``checks``: which
    (None: the whole catalogue), in their order. ``jobs``: processes to check in (several
    implementations at a time, or one implementation's checks shared out over them); the
    verdicts don't depend on it.
    """

    profile: str = "quick"
    seed: int | None = None
    strict: bool = False
    verbosity: str | None = None
    replay: Case | None = None
    time_budget: float | None = None
    database: ExampleDatabase | None = None
    pictures: bool = False
    devices: tuple[str, ...] | None = None
    checks: tuple[str, ...] | None = None
    jobs: int = 1

    def __post_init__(self) -> None:
        # Lists as callers write them (devices=["cpu"]), kept as tuples: the options are frozen.
        for name in ("devices", "checks"):
            value: Iterable[str] | None = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))


def replay_case(replay: Case | str | None) -> Case | None:
    """The case to replay: a :class:`~conformance.generation.cases.Case`, or its text as a report
    prints it (``Case(batch=1, q_len=2, ...)``; a ValueError says what is wrong with it)."""
    return Case.parse(replay) if isinstance(replay, str) else replay
