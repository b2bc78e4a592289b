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
"""

from __future__ import annotations

import builtins
import math
import operator
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

    def restore(self) -> tuple[str, ...]:
        """Put back every recorded attribute that was replaced or deleted; the names put back
        (``torch.Tensor.__sub__``), in the order of the namespaces."""
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


def _name(space: object) -> str:
    if isinstance(space, ModuleType):
        return space.__name__
    return f"{getattr(space, '__module__', '')}.{getattr(space, '__qualname__', space)}"
