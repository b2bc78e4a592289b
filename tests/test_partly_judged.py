"""A verdict that judged fewer than half the checks says so on its summary line, with why
(issue 65): the checks skipped for what the implementation does not have are its contract, the
others (an instrument that did not fit it) are named."""

from __future__ import annotations

from conformance.frontends.report import summary
from conformance.model.results import CheckResult, Status, partly_judged

UNFIT = "no weight layout maps it to per-head q/k/v projections"


def _results(judged: int, absent: int, unfit: int, failed: bool = False) -> list[CheckResult]:
    results = [CheckResult("m", f"judged{i}", "cpu", Status.PASSED) for i in range(judged)]
    if failed:
        results[0].status = Status.FAILED
    results += [CheckResult("m", f"absent{i}", "cpu", Status.SKIPPED, reason="inferred: no X",
                            absent=True) for i in range(absent)]
    results += [CheckResult("m", f"unfit{i}", "cpu", Status.SKIPPED, reason=UNFIT)
                for i in range(unfit)]
    return results


def test_fewer_than_half_judged_is_said_with_the_checks_and_why():
    (found,) = partly_judged(_results(judged=10, absent=12, unfit=5))
    assert (found.judged, found.total, found.absent) == (10, 27, 12)
    assert found.unjudged == tuple(f"unfit{i}" for i in range(5)) and found.why == UNFIT
    text = summary(_results(judged=10, absent=12, unfit=5), 1.0)
    assert "Partly judged: m on cpu: 10 of 27 checks judged; 12 skipped for what it does" in text
    assert "OK: no unexpected failure; but 1 implementation(s) had fewer than half" in " ".join(
        text.split())


def test_half_judged_or_a_failure_says_nothing_more():
    assert partly_judged(_results(judged=14, absent=13, unfit=0)) == []
    assert partly_judged(_results(judged=3, absent=12, unfit=5, failed=True)) == []


def test_absent_is_in_a_results_json_only_where_true():
    assert "absent" not in _results(1, 0, 1)[1].to_dict()
    assert _results(0, 1, 0)[0].to_dict()["absent"] is True


def test_skips_for_what_it_is_or_has_alone_say_nothing_more():
    """Linear attention lacks a KV cache and a softmax: 12 of 27 judged is all there is to it."""
    assert partly_judged(_results(judged=12, absent=15, unfit=0)) == []
