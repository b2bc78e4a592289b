"""Broken twins of the bundled kernels (:mod:`conformance.implementations.kernels`): each a bug
hand-written attention backward passes are known to ship, kept to prove the checks catch it in
half precision with nothing declared.

Every module documents its bug, the symptom, and in ``CATCHES`` the check that must fail; its
``KERNEL`` is the function a user would point the suite at. Each subclasses the correct
:class:`~conformance.implementations.kernels.Kernel` and overrides only the step its bug lives in.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

KERNEL_MUTANT_MODULES: tuple[ModuleType, ...] = tuple(
    importlib.import_module(f"{__name__}.{info.name}")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name))
