"""A search verifies each case once: hypothesis' replay of the shrunk case, and a warning's second
search from the case that found it, raise what that case raised without running it again."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import strategies as st

from conformance import Capabilities
from conformance.checks.invariants.base import CheckContext
from conformance.checks.invariants.search import Search
from conformance.checks.invariants.violation import CheckFailed, Violation
from conformance.generation.cases import Case
from conformance.generation.profiles import profile_settings


def _context() -> CheckContext:
    return CheckContext(subject=None, capabilities=Capabilities(), device="cpu",
                        search=Search(profile_settings("quick")))


def _case(length: int) -> Case:
    return Case(batch=1, q_len=length, kv_len=length, num_heads=1, head_dim=4, seed=0)


def _counted(limit: int, severity: str, seen: Counter) -> object:
    def verify(case: Case) -> None:
        seen[case] += 1
        if case.q_len > limit:
            raise Violation(f"{case.q_len} > {limit}", severity=severity)
    return verify


def test_a_failing_search_reports_its_shrunk_case_verifying_each_case_once():
    seen: Counter = Counter()
    context = _context()
    with pytest.raises(CheckFailed) as failed:
        context.explore(st.integers(1, 1000).map(_case), _counted(10, "fail", seen))
    assert failed.value.case.q_len == 11 and str(failed.value.error) == "11 > 10"
    assert seen[_case(11)] == 1 and max(seen.values()) == 1


def test_a_warnings_second_search_starts_from_its_case_without_running_it_again():
    seen: Counter = Counter()
    context = _context()
    context.explore(st.integers(1, 1000).map(_case), _counted(10, "warn", seen))
    (warning,) = context.warnings
    first = next(case for case in seen if case.q_len > 10)
    assert warning.case == first and warning.error.severity == "warn"
    assert max(seen.values()) == 1


def test_a_case_that_passes_on_its_second_run_is_judged_by_its_first():
    runs: Counter = Counter()

    def first_run_fails(case: Case) -> None:
        runs[case] += 1
        if case.q_len > 10 and runs[case] == 1:
            raise Violation("failed on its first run")

    with pytest.raises(CheckFailed) as failed:
        _context().explore(st.integers(1, 1000).map(_case), first_run_fails)
    assert failed.value.case.q_len == 11 and str(failed.value.error) == "failed on its first run"
