"""What a report shows of verdicts, for tests that compare two runs."""

from __future__ import annotations

from conformance.model.results import CheckResult


def seen(results: list[CheckResult]) -> list[tuple]:
    """Everything a report shows of each verdict, in order (the time it took aside)."""
    return [(r.implementation, r.check, r.device, r.status, r.reason, r.counterexample,
             tuple(r.details), r.hint, tuple(r.observations)) for r in results]
