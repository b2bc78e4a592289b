"""Each check's time budget: a slow module gets a verdict in bounded time; a check cut short is a
warning saying how many examples ran (never a silent pass, never a hang), its failures stand,
``strict`` does not turn the run's time into the implementation's failure, and a run that is not
on a terminal still prints a line per check."""

from __future__ import annotations

import re

import pytest
from hypothesis import strategies as st

from conformance import Capabilities, Status, check
from conformance.checks.invariants.base import CheckContext
from conformance.checks.invariants.budget import MIN_EXAMPLES, Budget, BudgetSpent, budget_seconds
from conformance.checks.invariants.search import Search
from conformance.checks.invariants.violation import CheckFailed, Violation
from conformance.frontends.cli import main
from conformance.generation.cases import Case
from conformance.generation.profiles import profile_settings
from tests.fixtures.slow_modules import SlowAttention, SlowUnscaled

SHORT = 0.2
"""A budget the slow modules spend in their first few calls."""


def _ran(result) -> tuple[int, int]:
    ran, asked = re.search(r"(\d+) of the (\d+) examples asked for ran", result.reason).groups()
    return int(ran), int(asked)


def test_a_budget_lets_each_search_run_its_minimum_then_stops_it():
    budget = Budget(0.0)
    budget.search()
    for _ in range(MIN_EXAMPLES):
        budget.allow()
    with pytest.raises(BudgetSpent):
        budget.allow()
    budget.stopped(25)
    budget.search()  # the next search gets its minimum too
    budget.allow()
    assert budget.examples == MIN_EXAMPLES + 1
    assert budget.shortfall().startswith(f"its time budget (0 s) ran out: {MIN_EXAMPLES} of the "
                                         "25 examples asked for ran")


def test_no_budget_never_stops_and_the_profiles_scale_theirs():
    budget = Budget(None)
    for _ in range(100):
        budget.allow()
    assert budget.shortfall() is None
    assert budget_seconds(25) == 30.0 and budget_seconds(150) == 180.0


def test_a_slow_correct_module_cut_short_warns_saying_how_much_ran():
    gate, reference = check(SlowAttention, devices=["cpu"], checks=["gate", "reference"],
                            time_budget=SHORT)
    assert gate.status is Status.PASSED  # the gate is never cut: it decides what runs
    assert reference.status is Status.WARNED
    assert reference.reason.startswith("cut short: its time budget (0.2 s) ran out")
    assert reference.reason.endswith("the property held on each of them")
    ran, asked = _ran(reference)
    assert MIN_EXAMPLES <= ran < asked == 25


def test_a_failure_found_before_the_budget_ran_out_stands():
    (scale,) = check(SlowUnscaled, devices=["cpu"], checks=["scale"], time_budget=SHORT)
    assert scale.status is Status.FAILED and scale.counterexample
    assert scale.reason.startswith("the fitted logit scale is")


def test_a_failure_whose_shrinking_the_budget_stops_is_the_first_found():
    context = CheckContext(subject=None, capabilities=Capabilities(), device="cpu",
                           search=Search(profile_settings("quick"), budget=Budget(0.0)))
    with pytest.raises(CheckFailed) as failed:
        context.explore(st.integers(1, 1000).map(_case), _fails_above_ten)
    assert isinstance(failed.value.error, Violation) and failed.value.case.q_len > 11
    assert context.search.budget.unshrunk and not context.search.budget.cut


def _case(length: int) -> Case:
    return Case(batch=1, q_len=length, kv_len=length, num_heads=1, head_dim=4, dtype="float32",
                seed=0)


def _fails_above_ten(case: Case) -> None:
    """Fails above 10 queries: the smallest failing case has 11, a search's first has more."""
    if case.q_len > 10:
        raise Violation(f"{case.q_len} > 10")


def test_strict_does_not_fail_a_check_for_the_runs_time():
    (reference,) = check(SlowAttention, devices=["cpu"], checks=["reference"], strict=True,
                         time_budget=SHORT)
    assert reference.status is Status.WARNED


def test_no_budget_runs_the_whole_search():
    (reference,) = check(SlowAttention, devices=["cpu"], checks=["reference"], time_budget=0)
    assert reference.status is Status.PASSED


def test_a_negative_budget_is_one_line():
    with pytest.raises(ValueError, match="a time budget is a number of seconds >= 0"):
        check(SlowAttention, checks=["reference"], time_budget=-1)


def test_the_command_line_prints_a_line_per_check_and_the_cut_when_not_a_terminal(capsys):
    code = main(["check", "tests.fixtures.slow_modules:SlowAttention", "--check", "gate",
                 "--check", "reference", "--device", "cpu", "--time-budget", str(SHORT)])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "cut short: its time budget (0.2 s) ran out" in out
    lines = [line for line in err.splitlines() if " · " in line]
    assert [line.split(": ")[1].split(" (")[0] for line in lines] == ["passed", "warning"], err
