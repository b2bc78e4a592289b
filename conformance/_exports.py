"""A package's public names imported on first use (PEP 562), so that importing the package costs
nothing until a name is used.

Standard library only, and under every layer: the root package and ``conformance.worker`` (whose
stdlib-only modules must load before torch) both resolve their names here, each from its own
module ``__getattr__``, which imports this module only on a first lookup, so that importing
either package loads nothing more.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping


def export(package: str, namespace: MutableMapping[str, object], name: str,
           exports: Mapping[str, tuple[str, ...]],
           renamed: Mapping[str, tuple[str, str]] | None = None) -> object:
    """The public name ``name`` of ``package`` (whose globals are ``namespace``), imported from
    the module that defines it: ``exports`` maps a module to the names it defines under the same
    name, ``renamed`` a public name to the (module, name) it has there. The value is kept in
    ``namespace``, so that later lookups find it without coming back here; a name neither lists
    is an AttributeError, as on a plain module."""
    found = (renamed or {}).get(name) or next(
        ((module, name) for module, names in exports.items() if name in names), None)
    if found is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module, attribute = found
    value = getattr(importlib.import_module(module), attribute)
    namespace[name] = value
    return value
