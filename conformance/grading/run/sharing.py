"""One target's checks shared over the cores a grading run leaves idle.

Once the gate has passed with nothing amiss, the target's other checks run in threads: this one
through the target's own subject, each borrowed core's through a twin of it (a sandboxed worker
of its own, :meth:`~conformance.worker.IsolatedSubject.twin`, loaded while the first checks run).
A check is handed out only when every check it requires has its verdict (a failed prerequisite
decides what it runs without), otherwise in the rubric's order. Threads, not forks: the grading
run's other submissions are threads of this process, and a fork copies only the calling one.
The student's code runs in the workers, so the threads overlap where it does.

What the caller gets is what the checks one after another would give, up to the first check that
met trouble (a crash, a timeout, a broken limit, the grader's own exception): what follows
that depends on the worker's history (its restarts are counted per worker), so nothing from there
on is handed out, and the caller runs it again, one check after another, as it always would.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from conformance.grading.run.cores import Cores
from conformance.worker import IsolatedSubject


class Attempted(Protocol):
    @property
    def troubled(self) -> bool:
        """Whether what followed it would depend on the worker's history."""


T = TypeVar("T", bound=Attempted)

Attempt = Callable[[IsolatedSubject, str, Mapping[str, T]], T]
"""Run one check on a subject, given the verdicts of the checks it requires."""


@dataclass
class Shared(Generic[T]):
    """What the shared checks gave, and what the twins' workers printed."""

    done: dict[str, T]
    printed: list[str] = field(default_factory=list)
    printed_bytes: int = 0
    twins: int = 0


class _Board(Generic[T]):
    """The checks not handed out yet; each taken when its prerequisites are done."""

    def __init__(self, checks: Sequence[str], requires: Callable[[str], Iterable[str]]) -> None:
        self.order = list(checks)
        self.waiting = list(checks)
        # Only those before it in the order: the checks one after another have no verdict yet
        # of a prerequisite that comes after the check.
        self.needs = {check: [r for r in requires(check)
                              if r in self.order and self.order.index(r) < self.order.index(check)]
                      for check in checks}
        self.done: dict[str, T] = {}
        self.cutoff = len(self.order)  # nothing from here on is handed out
        self.condition = threading.Condition()

    def take(self) -> str | None:
        """The first check in the order whose prerequisites are done (waiting for one), None
        when nothing is left to hand out."""
        with self.condition:
            while True:
                self.waiting = [c for c in self.waiting if self.order.index(c) < self.cutoff]
                if not self.waiting:
                    return None
                for check in self.waiting:
                    if all(need in self.done for need in self.needs[check]):
                        self.waiting.remove(check)
                        return check
                self.condition.wait()

    def finish(self, check: str, attempt: T | None) -> None:
        with self.condition:
            if attempt is None or attempt.troubled:
                self.cutoff = min(self.cutoff, self.order.index(check))
            if attempt is not None:
                self.done[check] = attempt
            self.condition.notify_all()

    def needed(self, check: str) -> dict[str, T]:
        """The verdicts of the checks ``check`` requires."""
        with self.condition:
            return {need: self.done[need] for need in self.needs[check]}

    def verdicts(self) -> dict[str, T]:
        with self.condition:
            return dict(self.done)


def run(checks: Sequence[str], subject: IsolatedSubject, attempt: Attempt[T],
        requires: Callable[[str], Iterable[str]], cores: Cores | None) -> Shared[T] | None:
    """``checks`` run over ``subject`` and a twin per core ``cores`` lends (at most one fewer
    than the checks); None where none is lent (nothing ran: the caller runs them)."""
    if cores is None or len(checks) < 2:
        return None
    lent = cores.borrow(len(checks) - 1)
    if not lent:
        return None
    board: _Board[T] = _Board(checks, requires)
    twins: list[IsolatedSubject] = []
    try:
        for _ in range(lent):
            twin = subject.twin()
            if twin is None:
                break
            twins.append(twin)
        if not twins:
            return None
        threads = [threading.Thread(target=_work, args=(board, twin, attempt, True),
                                    name=f"checks-{index}", daemon=True)
                   for index, twin in enumerate(twins, 1)]
        for thread in threads:
            thread.start()
        _work(board, subject, attempt, False)
        for thread in threads:
            thread.join()
        shared: Shared[T] = Shared(board.verdicts(), twins=len(twins))
        for twin in twins:
            shared.printed.append(twin.output)
            shared.printed_bytes += twin.printed_bytes
        return shared
    finally:
        for twin in twins:
            twin.close()
        cores.release(lent)


def _work(board: _Board[T], subject: IsolatedSubject, attempt: Attempt[T], twin: bool) -> None:
    """Take checks from ``board`` until none is left (a twin first waits for its load: one that
    does not load as the first did takes none)."""
    if twin and not subject.ready():
        return
    while (check := board.take()) is not None:
        result = None
        try:
            result = attempt(subject, check, board.needed(check))
        except Exception:  # the caller runs it again, where it raises as ever
            pass
        finally:
            board.finish(check, result)
