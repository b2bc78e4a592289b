"""Module fixtures that do only the work the selected tests need (``-k``, node ids).

A fixture that checks every bundled implementation asks :func:`wanted` which ones the module's
selected tests are about: each test parametrized by an implementation names its own, a test
that takes the fixture without such a parameter needs them all.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest


def wanted(request: pytest.FixtureRequest, fixtures: set[str],
           implementation: Callable[[dict], str | None]) -> set[str] | None:
    """The implementations the selected tests of ``request``'s module need from ``fixtures``
    (``implementation`` reads one from a test's parameters, None where they name none), or None
    for every one."""
    names: set[str] = set()
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module:
            continue
        if not fixtures & set(getattr(item, "fixturenames", ())):
            continue
        callspec = getattr(item, "callspec", None)
        name = implementation(callspec.params) if callspec is not None else None
        if name is None:
            return None
        names.add(name)
    return names
