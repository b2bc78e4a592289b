"""The catalogue as pytest tests: collected by ``pytest --pyargs conformance --attention-impl IMPL``.

One test function per check; the plugin parametrizes each over implementations and devices.
"""

from __future__ import annotations

from conformance.checks.catalogue import CATALOGUE, GATE
from conformance.frontends.pytest_catalogue import catalogue_reproduction as _reproduction
from conformance.frontends.pytest_catalogue import enforce as _enforce
from conformance.model.check_names import CHECK_NAMES
from conformance.run.runner import Runner as _Runner

_TITLES = {GATE.name: GATE.title, **{check.name: check.title for check in CATALOGUE}}


def _make_test(name: str):
    def test(attention_target, attention_runner: _Runner, request) -> None:
        subject, device = attention_target
        _enforce(attention_runner.run_check(subject, name, device),
                 _reproduction(request.config))

    test.__name__ = f"test_{name}"
    test.__qualname__ = test.__name__
    test.__doc__ = _TITLES[name]
    return test


for _name in CHECK_NAMES:
    globals()[f"test_{_name}"] = _make_test(_name)
