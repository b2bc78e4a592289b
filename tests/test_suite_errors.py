"""An internal error of the suite is never the implementation's verdict: a check that raises its
own exception gives a suite error, which the command line exits 2 on, pytest raises as the
suite's (not a failure of the implementation) and grading never charges (tests/
test_grading_scoring.py)."""

from __future__ import annotations

import pytest

from conformance import Status, check
from conformance.checks.catalogue import by_name
from conformance.errors import SuiteError
from conformance.frontends.cli import main
from conformance.frontends.pytest_catalogue import enforce
from conformance.run.runner import SUITE_ERROR_WORDS


@pytest.fixture
def broken_scale(monkeypatch):
    """The scale check with a defect of the suite's own: its run raises."""
    def run(context):
        raise KeyError("a defect of the suite")

    monkeypatch.setattr(by_name("scale"), "run", run)


def test_a_check_that_raises_is_a_suite_error_not_a_failure(broken_scale):
    results = {r.check: r for r in check("textbook", devices=["cpu"],
                                         checks=["gate", "scale", "head_split"])}
    assert results["scale"].status is Status.SUITE_ERROR
    assert results["scale"].reason.startswith(SUITE_ERROR_WORDS)
    assert "KeyError" in results["scale"].reason
    assert results["head_split"].status is Status.PASSED  # the others still run
    with pytest.raises(SuiteError, match="the suite itself failed in this check"):
        enforce(results["scale"])


def test_the_command_line_exits_2_on_a_suite_error(broken_scale, capsys):
    code = main(["check", "textbook", "--check", "scale", "--no-isolate"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 2
    assert "SUITE ERROR: the suite itself failed in 1 check(s)" in out
    assert "ERROR textbook · scale [cpu]" in out
