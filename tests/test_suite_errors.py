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


def _its_code():
    raise NotImplementedError("FlexAttention does not support backward on CPU")


def test_what_a_modules_own_code_raises_while_probed_is_one_line_and_says_where():
    from conformance.loading.registry import ResolveError
    from conformance.loading.target_kinds import _probed

    with pytest.raises(ResolveError, match=r"Layer: its code raised NotImplementedError: "
                                           r"FlexAttention does not support backward on CPU at "
                                           r"test_suite_errors\.py:\d+ while the suite probed"):
        _probed(_its_code, "Layer")


def test_the_suites_own_exception_while_inferring_is_the_suites():
    from conformance.errors import clipped, raised_by_its_code
    from conformance.loading.target_kinds import _probed

    with pytest.raises(AttributeError) as raised:
        _probed(lambda: clipped(None, 3), "Layer")  # raised inside the suite: not the module's
    assert raised_by_its_code(raised.value) is None


def test_the_command_line_says_an_internal_error_in_one_line(monkeypatch, capsys):
    import conformance.frontends.cli as cli

    def broken(args):
        raise KeyError("a key the suite forgot")

    monkeypatch.setattr(cli, "_check", broken)
    assert main(["check", "textbook"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attention-conformance: internal error (the suite's own, not the code "
                          "checked): KeyError: 'a key the suite forgot'; please report it")
    assert "Traceback" not in err
