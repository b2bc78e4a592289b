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


def test_a_replayed_case_runs_only_in_a_search_that_draws_such_cases():
    """A one-token case (printed by contract) replayed into a search of two tokens or more, or a
    masked case into a module without a mask, is not run there, and said; it runs where it
    fits. What a filtered strategy of cases() asks for is read through the filter."""
    from conformance.generation.replay_fit import Drawn, drawn_of, misfit
    from conformance.generation.strategies import cases

    caps = Capabilities()
    strategy = cases(caps, "cpu", min_len=2, masks="auto").filter(lambda case: True)
    drawn = drawn_of(strategy)
    assert (drawn.min_len, drawn.masks) == (2, "auto")
    assert misfit(_case(1), caps, drawn_of(strategy)) == "it has 1 token(s), fewer than 2"
    masked = Case(batch=2, q_len=3, kv_len=3, num_heads=1, head_dim=4, seed=0, kept=(1, 2))
    assert "a mask, where it takes none here" in misfit(masked, caps, Drawn(masks="auto"))
    assert misfit(_case(3), caps, drawn_of(strategy)) is None

    ran: Counter = Counter()
    search = Search(profile_settings("quick"), replay=_case(1))
    context = CheckContext(subject=None, capabilities=caps, device="cpu", search=search)
    context.explore(strategy, _counted(0, "fail", ran))
    assert not ran and any("not one this search draws" in note for note in search.observations)
    context.explore(cases(caps, "cpu"), _counted(5, "fail", ran))
    assert ran == Counter({_case(1): 1})  # where it fits, it runs
