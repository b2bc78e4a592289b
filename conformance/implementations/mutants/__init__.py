"""Realistic broken implementations, each a bug people ship, kept to prove the checks catch them.

Every mutant module documents its bug, the symptom, and in ``CATCHES`` the check that must fail.
Each subclasses the correct :mod:`conformance.implementations.mutants.textbook` attention and overrides only
the step its bug lives in. Every module of this package but ``textbook`` is a mutant.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

MUTANT_MODULES: tuple[ModuleType, ...] = tuple(
    importlib.import_module(f"{__name__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name)
    if info.name != "textbook"
)
