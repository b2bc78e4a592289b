"""The catalogue: the gate and the checks after it, in report order, as data.

A check is one module of :mod:`conformance.checks.invariants` whose :class:`Check` subclass sets
``name`` and ``order``: it is found here, run by :mod:`conformance.run.runner` in that order and
listed by ``list --checks``. What only needs the names reads
:data:`conformance.model.check_names.CHECK_NAMES`, which reads the same modules' text without
importing them, and which this module holds to what it imports.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import conformance.checks.invariants as invariants
from conformance.checks.invariants.base import Check
from conformance.checks.invariants.gate import Gate
from conformance.model.check_names import CHECK_NAMES


def _discovered() -> tuple[Check, ...]:
    """One instance of each check the invariants' modules define, by ``order``."""
    found: dict[str, type[Check]] = {}
    for module_info in pkgutil.iter_modules(invariants.__path__):
        module = importlib.import_module(f"{invariants.__name__}.{module_info.name}")
        for cls in vars(module).values():
            if (inspect.isclass(cls) and issubclass(cls, Check) and cls.__module__ == module.__name__
                    and "order" in vars(cls) and not inspect.isabstract(cls)):
                if cls.name in found:
                    raise ImportError(f"two checks are called {cls.name!r}: "
                                      f"{found[cls.name].__qualname__} and {cls.__qualname__}")
                found[cls.name] = cls
    return tuple(cls() for cls in sorted(found.values(), key=lambda cls: cls.order))


GATE = Gate()
CATALOGUE: tuple[Check, ...] = _discovered()
"""The checks after the gate, in report order."""

if (GATE.name, *(c.name for c in CATALOGUE)) != CHECK_NAMES:
    raise ImportError("conformance.model.check_names read the checks as "
                      f"{', '.join(CHECK_NAMES)}, and the catalogue imported "
                      f"{', '.join(c.name for c in CATALOGUE)}: each check class sets name and "
                      "order as plain literals")


def by_name(name: str) -> Check:
    """The check called ``name`` (not the gate)."""
    for check in CATALOGUE:
        if check.name == name:
            return check
    raise ValueError(f"unknown check {name!r}: choose from {', '.join(CHECK_NAMES)}")
