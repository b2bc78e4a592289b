"""Undoing a submission's patches to torch in the worker.

The worker runs the suite's own code beside the submission's: inference compares outputs there
(``(a - b).abs()``, ``torch.allclose``), and the codec turns replies into bytes there. A
submission that replaces ``torch.allclose`` or ``torch.Tensor.__sub__`` when it is imported, or
while it runs, would otherwise change what that code concludes. A :class:`Pristine` records the
attributes of the namespaces the suite relies on before any submission code runs, and puts back
whatever was replaced or deleted after each piece of submission code (the import, every
request). Attributes added to a class go too (they can shadow inherited ones); those added to a
module are left alone (torch adds its lazily imported submodules itself).

Patches made and undone within one call of the submission's own code stay its own business:
they change only what that call computes, which the checker judges.

Most requests change nothing, and comparing the 1,500 attributes took 78 us of every request (a
sixth of the worker's time on a small forward). Where CPython keeps a version tag on each
dictionary, changed by every change to it (PEP 509's ``ma_version_tag``, 3.11 to 3.13), the
namespaces' tags are read first (under a microsecond): none changed since the last restore, no
attribute did either. Whether this interpreter's dictionaries have such a tag is tested on one of
its own before it is relied on; where not, every restore compares.
"""

from __future__ import annotations

import builtins
import ctypes
import gc
import math
import operator
import sys
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional
import torch.testing

NAMESPACES: tuple[object, ...] = (torch, torch.Tensor, torch.nn.functional, torch.testing,
                                  torch.nn.Module, torch.autograd, math, builtins)


class Pristine:
    """The attributes of :data:`NAMESPACES` as they were when this was made."""

    def __init__(self, namespaces: tuple[object, ...] = NAMESPACES) -> None:
        self._saved = []
        for space in namespaces:
            names, values = zip(*vars(space).items(), strict=True)
            self._saved.append((space, names, values))
        self._versions = version_reader(namespaces)
        self._seen = self._versions() if self._versions is not None else None

    def restore(self) -> tuple[str, ...]:
        """Put back every recorded attribute that was replaced or deleted; the names put back
        (``torch.Tensor.__sub__``), in the order of the namespaces."""
        if self._versions is not None and self._versions() == self._seen:
            return ()  # no namespace changed since it was last left as recorded
        restored = self._compared()
        if self._versions is not None:
            self._seen = self._versions()
        return restored

    def _compared(self) -> tuple[str, ...]:
        restored = []
        for space, names, values in self._saved:
            current = vars(space)
            # The common case (nothing patched): the same keys and values in the same order, in
            # C-level identity comparisons without a lookup (a third faster than ``get`` per name).
            if (len(current) == len(names) and all(map(operator.is_, current, names))
                    and all(map(operator.is_, current.values(), values))):
                continue
            if isinstance(space, type):
                # On a class an added attribute can shadow an inherited one (``Tensor.__sub__``
                # lives on ``TensorBase``): it goes too.
                for name in set(current) - set(names):
                    delattr(space, name)
                    restored.append(f"{_name(space)}.{name}")
            for name, value in zip(names, values, strict=True):
                if current.get(name, _MISSING) is not value:
                    try:
                        setattr(space, name, value)
                    except (AttributeError, TypeError):  # read-only slots can't be patched either
                        continue
                    restored.append(f"{_name(space)}.{name}")
        return tuple(restored)


_MISSING = object()

_VERSION_OFFSET = 3 * ctypes.sizeof(ctypes.c_ssize_t)
"""Where a ``PyDictObject``'s ``ma_version_tag`` lies (CPython 3.11 to 3.13): after the reference
count, the type and ``ma_used``."""


def version_reader(namespaces: tuple[object, ...]) -> Callable[[], tuple[int, ...]] | None:
    """A function giving the version tags of the dictionaries behind ``namespaces`` (a class's
    ``vars`` is a read-only view of one), or None where this interpreter's dictionaries have no
    tag that every change to them changes: tested first on a dictionary and a class of its own
    (an update in place, a deletion, an insertion, a class attribute set), so another layout
    (a debug build, a later CPython) compares every attribute instead of misreading memory."""
    if sys.implementation.name != "cpython" or not (3, 11) <= sys.version_info[:2] <= (3, 13):
        return None
    probe, probe_class = {"kept": 0}, type("Probe", (), {})
    tables = [_table(space) for space in (probe, probe_class, *namespaces)]
    if any(found is None for found in tables):
        return None
    probe_tags = _Tags(tables[:2])
    seen = [probe_tags()]
    # Each change touches one of the two dictionaries: every one must give new tags.
    for change in (lambda: probe.__setitem__("kept", 1), lambda: probe.pop("kept"),
                   lambda: probe.__setitem__("added", 2), lambda: setattr(probe_class, "added", 1)):
        change()
        seen.append(probe_tags())
    return _Tags(tables[2:]) if len(set(seen)) == len(seen) else None


def _table(space: object) -> dict | None:
    """The dictionary behind ``space``: itself, its module's, or the one a class's read-only view
    shows."""
    found = space if type(space) is dict else vars(space)
    if type(found) is not dict:
        found = next((r for r in gc.get_referents(found) if type(r) is dict), None)
    return found


class _Tags:
    """The version tags of some dictionaries, read in place (they are kept alive here: their
    addresses are read)."""

    def __init__(self, tables: list[dict]) -> None:
        self._tables = tables
        self._tags = [ctypes.c_uint64.from_address(id(found) + _VERSION_OFFSET)
                      for found in tables]

    def __call__(self) -> tuple[int, ...]:
        return tuple(tag.value for tag in self._tags)


def _name(space: object) -> str:
    if isinstance(space, ModuleType):
        return space.__name__
    return f"{getattr(space, '__module__', '')}.{getattr(space, '__qualname__', space)}"
