"""``pytest --attention-html PATH``: the page ``check --html`` writes, for a pytest run's checks.

The catalogue's tests and those of :func:`conformance.testing.parametrize_with_checks` alike:
each verdict a test enforces travels with its test's report (so under pytest-xdist too, from the
workers to the process that writes the page), its minimal case drawn (the Runner is asked for
pictures). Registered by the light plugin only when the option is given.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from conformance.frontends.pytest_options import current_config

if TYPE_CHECKING:
    from conformance.model.results import CheckResult

REPORT_KEY = "attention_conformance_result"
"""The attribute of a test's report that carries its verdict (plain data)."""

_ENFORCED: list[CheckResult] = []
"""The verdict the test running in this process enforced (one test at a time)."""

_COLLECTED = pytest.StashKey[list[dict]]()
_STARTED = pytest.StashKey[float]()


def enforced(result: CheckResult) -> None:
    """Called as a test enforces ``result``: its report carries it."""
    _ENFORCED[:] = [result]


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_COLLECTED] = []
    session.config.stash[_STARTED] = time.perf_counter()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and _ENFORCED:
        setattr(report, REPORT_KEY, _ENFORCED.pop().to_dict())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    data = getattr(report, REPORT_KEY, None)
    config = current_config()
    if data is not None and report.when == "call" and config is not None:
        config.stash[_COLLECTED].append(data)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller writes it
        return
    from conformance.frontends.html_report import render_html
    from conformance.frontends.pytest_options import profile
    from conformance.model.check_names import CHECK_NAMES

    results = [_result(data) for data in config.stash.get(_COLLECTED, [])]
    path = Path(config.getoption("attention_html"))
    # A device every check skipped (absent here) is left out, as the command line's report does.
    devices = sorted({r.device for r in results if r.status.value != "skipped"}) or ["cpu"]
    results = [r for r in results if r.device in devices]
    present = {r.check for r in results}
    path.write_text(render_html(results, checks=[c for c in CHECK_NAMES if c in present],
                                profile=profile(config), devices=devices,
                                seconds=time.perf_counter() - config.stash[_STARTED],
                                interface="pytest"), encoding="utf-8")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"attention-conformance: {len(results)} verdict(s) in {path}")


def _result(data: dict) -> CheckResult:
    """A verdict again from its report's plain data (what it would declare is said by the
    test's own failure; the page leaves it out)."""
    from conformance.model.picture import Picture
    from conformance.model.results import CheckResult, Route, Status

    data = dict(data)
    picture = data.pop("picture", None)
    data.pop("remedy", None)
    route = data.pop("route", None)
    return CheckResult(**{**data, "status": Status(data["status"])},
                       route=Route(route) if route else None,
                       picture=Picture(**picture) if picture else None)
