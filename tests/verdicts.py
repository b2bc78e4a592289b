"""What a report shows of verdicts, and the forks a run made, for tests that compare two runs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from conformance.model.results import CheckResult


def seen(results: list[CheckResult]) -> list[tuple]:
    """Everything a report shows of each verdict, in order (the time it took aside)."""
    return [(r.implementation, r.check, r.device, r.status, r.reason, r.counterexample,
             tuple(r.details), r.hint, tuple(r.observations)) for r in results]


@contextlib.contextmanager
def counted_forks() -> Iterator[list[int]]:
    """The pid of each fork this process makes meanwhile (so that a test knows checks were
    shared, not run one after another by a silent fall back)."""
    made: list[int] = []
    fork = os.fork

    def counted() -> int:
        pid = fork()
        if pid:
            made.append(pid)
        return pid

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "fork", counted)
        yield made
